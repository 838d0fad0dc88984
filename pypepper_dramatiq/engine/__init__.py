"""The engine both drivers share: claim a step, record its outcome under the rules.

* :mod:`.step_io`: :class:`~.step_io.StepIO`, the claims and records of steps in the job store;
* :mod:`.running`: the one registry of what runs in this process;
* :mod:`.hooks`: the ``on_final_failure`` hooks, called once per job and task
  (by the worker that recorded the failure, or by the recovery sweep).

The decisions themselves are :mod:`pypepper_dramatiq.rules.steps` (pure).
"""
