"""Driver 2: job steps as Dramatiq messages, run by ordinary ``dramatiq`` workers.

* :mod:`.setup`: ``setup()``, one call that wires a process;
* :mod:`.middleware`: :class:`~.middleware.WorkflowMiddleware`, claims and records each step;
* :mod:`.step_actor`: the step actor and one attempt in a worker thread;
* :mod:`.leases`, :mod:`.recovery`, :mod:`.orphans`, :mod:`.cancel_listener`: the
  background threads of a worker process (lease renewal, recovery of dead workers'
  steps, stranded delayed messages, cancels heard over Redis).
"""
