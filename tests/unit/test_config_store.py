"""The YAML configuration and the choice of the job store (memory here; SQL elsewhere)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

from pypepper_dramatiq import (
    CallableExecutor,
    ConfigError,
    IJobStore,
    Job,
    PersistenceWarning,
    PypepperError,
    Status,
    StoreNotConfiguredError,
    StoreUnavailableError,
    Task,
    Workflow,
    config,
    configure_job_store,
    get_job_store,
    manager,
    reset_job_store,
    set_job_store,
    setup_from_config,
)
from pypepper_dramatiq.stores.memory import MemoryJobStore

POSTGRES_YAML = """\
scheduler:
  jobStore:
    backend: postgres
    uri: postgresql+psycopg://user:secret@localhost:1/never_used
"""


def write(tmp_path: Path, text: str, name: str = "app.config.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def make_job(channel_id: str = "cfg") -> Job:
    job = Job(category="cfg", channel_id=channel_id)
    job.workflows.append(
        Workflow(
            [
                Task(
                    channel_id,
                    "d",
                    "f",
                    "t",
                    None,
                    "",
                    [],
                    CallableExecutor(lambda task, context: 1),
                )
            ]
        )
    )
    return job


def persistence_warnings(record: list[warnings.WarningMessage]) -> list[warnings.WarningMessage]:
    return [w for w in record if issubclass(w.category, PersistenceWarning)]


# -- load_config ------------------------------------------------------------------------------


def test_load_config_returns_the_mapping(tmp_path: Path) -> None:
    path = write(tmp_path, "app:\n  name: demo\n  port: 8080\nitems: [1, 2]\n")
    data = config.load_config(path)
    assert data == {"app": {"name": "demo", "port": 8080}, "items": [1, 2]}
    assert config.get_yml_config() == data
    assert config.path == path


def test_load_config_accepts_a_string_path(tmp_path: Path) -> None:
    path = write(tmp_path, "a: 1\n")
    assert config.load_config(str(path)) == {"a": 1}


def test_get_yml_config_is_a_copy(tmp_path: Path) -> None:
    config.load_config(write(tmp_path, "a: {b: 1}\n"))
    copy = config.get_yml_config()
    copy["a"]["b"] = 2
    assert config.get_yml_config() == {"a": {"b": 1}}


def test_broken_yaml_raises_config_error_naming_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "a: 1\nb: 2\nc: [1, 2\nd: 3\n", name="broken.yaml")
    with pytest.raises(ConfigError) as info:
        config.load_config(path)
    error = info.value
    assert isinstance(error, ValueError)
    assert isinstance(error, PypepperError)
    assert str(path) in str(error)
    assert "line 4" in str(error)


def test_broken_yaml_reports_the_line_of_the_problem(tmp_path: Path) -> None:
    path = write(tmp_path, "first: 1\nsecond: 2\nthird: 3\n  bad: indent\n", name="indent.yaml")
    with pytest.raises(ConfigError, match="line 4"):
        config.load_config(path)


def test_broken_yaml_keeps_the_previous_configuration(tmp_path: Path) -> None:
    config.load_config(write(tmp_path, "good: true\n"))
    with pytest.raises(ConfigError):
        config.load_config(write(tmp_path, "x: [\n", name="bad.yaml"))
    assert config.get_yml_config() == {"good": True}


def test_missing_file_raises_config_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "app.yaml"
    with pytest.raises(ConfigError) as info:
        config.load_config(missing)
    assert isinstance(info.value, ValueError)
    assert str(missing) in str(info.value)


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", "42\n"])
def test_non_mapping_top_level_raises_config_error(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        config.load_config(path)
    assert str(path) in str(info.value)


def test_empty_file_is_an_empty_mapping(tmp_path: Path) -> None:
    assert config.load_config(write(tmp_path, "")) == {}


# -- the deferred-backend guard ---------------------------------------------------------------


def test_load_config_does_not_apply_the_store(tmp_path: Path) -> None:
    config.load_config(write(tmp_path, POSTGRES_YAML))
    with pytest.raises(StoreNotConfiguredError):
        get_job_store()


def test_durable_yaml_backend_without_setup_makes_save_and_get_raise(tmp_path: Path) -> None:
    config.load_config(write(tmp_path, POSTGRES_YAML))
    job = make_job()
    with pytest.raises(StoreNotConfiguredError) as info:
        job.save()
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, PypepperError)
    assert job.version == 0
    with pytest.raises(StoreNotConfiguredError):
        Job.get_saved(job.id)


def test_durable_yaml_backend_without_setup_makes_scheduled_raise_and_queue_nothing(
    tmp_path: Path,
) -> None:
    config.load_config(write(tmp_path, POSTGRES_YAML))
    channel = manager.new("cfg")
    job = make_job("cfg")
    with pytest.raises(StoreNotConfiguredError):
        job.scheduled()
    assert job.status is Status.UNKNOWN
    assert channel.length() == 0
    assert channel.take() is None


@pytest.mark.parametrize("backend", ["postgres", "mysql", "mongodb", "Postgres"])
def test_every_durable_yaml_backend_arms_the_guard(tmp_path: Path, backend: str) -> None:
    config.load_config(write(tmp_path, f"scheduler:\n  jobStore:\n    backend: {backend}\n"))
    with pytest.raises(StoreNotConfiguredError):
        make_job().save()
    with pytest.raises(StoreNotConfiguredError):
        Job.get_saved("x")


def test_set_yml_config_arms_the_guard_like_a_loaded_file() -> None:
    config.set_yml_config({"scheduler": {"jobStore": {"backend": "postgres"}}})
    with pytest.raises(StoreNotConfiguredError):
        make_job().save()


def foreign_store() -> IJobStore:
    """A store that is not the in-memory one (it delegates every abstract method to one)."""
    inner = MemoryJobStore()

    def delegate(name: str) -> Any:
        return lambda self, *args, **kwargs: getattr(inner, name)(*args, **kwargs)

    methods = {name: delegate(name) for name in IJobStore.__abstractmethods__}
    store: IJobStore = type("ForeignStore", (IJobStore,), methods)()
    return store


def test_installing_a_non_memory_store_clears_the_guard_without_warning(tmp_path: Path) -> None:
    config.load_config(write(tmp_path, POSTGRES_YAML))
    store = foreign_store()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        set_job_store(store)
    assert persistence_warnings(record) == []
    assert get_job_store() is store
    job = make_job()
    assert job.save()
    assert store.get(job.id) is not None


def test_configure_memory_clears_the_guard_and_warns_once(tmp_path: Path) -> None:
    config.load_config(write(tmp_path, POSTGRES_YAML))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        store = configure_job_store("memory")
    assert len(persistence_warnings(record)) == 1
    assert "postgres" in str(persistence_warnings(record)[0].message)
    assert isinstance(store, MemoryJobStore)
    assert get_job_store() is store

    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        set_job_store(MemoryJobStore())
        configure_job_store("memory")
    assert persistence_warnings(record) == []

    job = make_job()
    job.scheduled()
    saved = Job.get_saved(job.id)
    assert saved is not None and saved.status == "Scheduled"


def test_set_job_store_memory_also_clears_the_guard_with_a_warning(tmp_path: Path) -> None:
    config.load_config(write(tmp_path, POSTGRES_YAML))
    store = MemoryJobStore()
    with pytest.warns(PersistenceWarning):
        set_job_store(store)
    assert get_job_store() is store
    assert make_job().save()


def test_reset_job_store_rearms_the_guard_and_the_warning(tmp_path: Path) -> None:
    config.load_config(write(tmp_path, POSTGRES_YAML))
    with pytest.warns(PersistenceWarning):
        configure_job_store("memory")
    assert make_job().save()

    reset_job_store()
    with pytest.raises(StoreNotConfiguredError):
        make_job().save()
    with pytest.raises(StoreNotConfiguredError):
        Job.get_saved("anything")
    with pytest.warns(PersistenceWarning):
        configure_job_store("memory")
    assert make_job().save()


def test_reset_job_store_forgets_saved_jobs() -> None:
    job = make_job()
    assert job.save()
    reset_job_store()
    assert Job.get_saved(job.id) is None


@pytest.mark.parametrize(
    "text",
    [
        "scheduler:\n  jobStore:\n    backend: memory\n",
        "scheduler:\n  jobStore:\n    backend: MEMORY\n",
        "app:\n  name: demo\n",
        "scheduler:\n  other: 1\n",
        "",
    ],
)
def test_memory_or_absent_backend_never_raises_nor_warns(tmp_path: Path, text: str) -> None:
    config.load_config(write(tmp_path, text))
    job = make_job()
    job.scheduled()
    saved = Job.get_saved(job.id)
    assert saved is not None and saved.status == "Scheduled"
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        configure_job_store("memory")
        set_job_store(MemoryJobStore())
    assert persistence_warnings(record) == []


def test_without_any_config_the_default_store_is_memory() -> None:
    assert isinstance(get_job_store(), MemoryJobStore)
    assert get_job_store() is get_job_store()


# -- setup_from_config / configure_job_store --------------------------------------------------


def test_setup_from_config_with_memory_installs_a_memory_store(tmp_path: Path) -> None:
    config.load_config(write(tmp_path, "scheduler:\n  jobStore:\n    backend: memory\n"))
    store = setup_from_config(config.get_yml_config())
    assert isinstance(store, MemoryJobStore)
    assert get_job_store() is store


def test_setup_from_config_without_section_installs_memory() -> None:
    store = setup_from_config({})
    assert isinstance(store, MemoryJobStore)
    assert get_job_store() is store


def test_setup_from_config_memory_replaces_a_previous_store() -> None:
    job = make_job()
    assert job.save()
    store = setup_from_config({"scheduler": {"jobStore": {"backend": "memory"}}})
    assert get_job_store() is store
    assert Job.get_saved(job.id) is None


def test_unknown_backend_raises_config_error_naming_it() -> None:
    with pytest.raises(ConfigError) as info:
        configure_job_store("nosuch")
    assert "nosuch" in str(info.value)
    assert isinstance(info.value, ValueError)


def test_unknown_backend_from_yaml_raises_config_error() -> None:
    with pytest.raises(ConfigError, match="cassandra"):
        setup_from_config({"scheduler": {"jobStore": {"backend": "cassandra"}}})


@pytest.mark.parametrize("options", [{}, {"user": "u", "password": "p", "db": "x"}])
def test_postgres_without_uri_or_host_raises_config_error(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        configure_job_store("postgres", **options)
    with pytest.raises(ConfigError):
        setup_from_config({"scheduler": {"jobStore": {"backend": "postgres", **options}}})


@pytest.mark.parametrize("port", ["abc", 0, 70000, True, 5.5])
def test_a_bad_port_raises_config_error_naming_it(port: Any) -> None:
    with pytest.raises(ConfigError, match="port"):
        configure_job_store("postgres", host="127.0.0.1", port=port)


def test_a_port_given_as_digits_is_taken() -> None:
    # The engine is built, then the schema check meets no server on port 1.
    with pytest.raises(StoreUnavailableError, match=":1/"):
        configure_job_store("mysql", host="127.0.0.1", port="1", user="u", db="d")


@pytest.mark.parametrize("option", ["pool_sise", "pool"])
def test_an_engine_option_it_cannot_take_raises_config_error_naming_it(option: str) -> None:
    store = configure_job_store("memory")
    with pytest.raises(ConfigError, match=option):
        configure_job_store("postgres", uri="postgresql+psycopg://u@127.0.0.1:1/x", **{option: 3})
    assert get_job_store() is store


def test_a_failed_configure_keeps_the_current_store() -> None:
    store = configure_job_store("memory")
    with pytest.raises(ConfigError):
        configure_job_store("nosuch")
    with pytest.raises(ConfigError):
        configure_job_store("postgres")
    assert get_job_store() is store


def test_non_mapping_job_store_section_raises_config_error_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"scheduler\.jobStore must be a mapping, not str"):
        setup_from_config({"scheduler": {"jobStore": "postgres"}})
    with pytest.raises(ConfigError, match=r"key scheduler must be a mapping, not list"):
        setup_from_config({"scheduler": ["jobStore"]})


def test_set_job_store_rejects_non_stores() -> None:
    with pytest.raises(TypeError):
        set_job_store(object())  # type: ignore[arg-type]
