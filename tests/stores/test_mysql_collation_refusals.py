"""Text a latin1 MariaDB table cannot compare is refused data, not an outage.

The README asks for a utf8mb4 database; on a latin1 one, looking up an id
outside latin1 makes MariaDB answer error 1267 ("illegal mix of collations"),
an OperationalError whose SQLSTATE is HY000. It was classified as an outage
("job store unavailable"), which callers retry, instead of a data error
(``errors.retry_may_cure`` is False for it), as the store's writes of the
same text already were.
"""

from __future__ import annotations

import pytest
from sqlalchemy import text

from pypepper_dramatiq.errors import StoreDataError, StoreUnavailableError, retry_may_cure
from pypepper_dramatiq.stores.sql import SqlJobStore

pytestmark = pytest.mark.mysql

#: In no latin1 (cp1252) code page: a C1 control, an emoji.
OUTSIDE_LATIN1 = ["\x80", "job-\U0001f600"]


@pytest.fixture
def latin1_store(mysql_store: SqlJobStore) -> SqlJobStore:
    with mysql_store.engine.connect() as conn:
        charset = conn.execute(
            text(
                "SELECT CCSA.character_set_name FROM information_schema.TABLES T"
                " JOIN information_schema.COLLATION_CHARACTER_SET_APPLICABILITY CCSA"
                " ON CCSA.collation_name = T.table_collation"
                " WHERE T.table_schema = DATABASE() AND T.table_name = 'scheduler_jobs'"
            )
        ).scalar()
    if charset != "latin1":
        pytest.skip(f"the test database is {charset}, not latin1")
    return mysql_store


@pytest.mark.parametrize("job_id", OUTSIDE_LATIN1)
def test_looking_up_an_id_a_latin1_table_cannot_compare_is_a_data_error(
    latin1_store: SqlJobStore, job_id: str
) -> None:
    with pytest.raises(StoreDataError) as refused:
        latin1_store.get(job_id)
    assert not isinstance(refused.value, StoreUnavailableError)
    assert not retry_may_cure(refused.value)
    assert "1267" in str(refused.value)
