"""The fault instrument: a history recorder, a checker, a harness of real processes.

- :mod:`tests.faults.recorder` logs every script call of a process as
  invoke / ok / fail / info operations (JSON lines), with both clocks;
- :mod:`tests.faults.evidence` gathers what a run left: the histories, the
  final records, the commit marks and the provider's log of applied effects;
- :mod:`tests.faults.checker` checks that evidence against the promise of
  DESIGN.md section 1;
- :mod:`tests.faults.cluster` starts a private Redis, a TCP proxy, a provider
  and RQ worker processes, and injects faults into them;
- :mod:`tests.faults.chaos` mixes the faults at random from a seed.
"""
