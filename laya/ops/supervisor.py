"""Keep ``laya up``'s router and worker running: a child that dies is started again.

A worker that llama.cpp crashes, or that the OOM killer takes, should not take
the server and the router down with it: the request it held is answered anyway
(a router's reaper requeues a job whose heartbeat stopped, see
:mod:`laya.router.reaper`). So a child that dies is restarted after a delay that
doubles with each quick death (``first_delay_s`` up to ``max_delay_s``, back to
the first once a child has run for ``window_s``). Restarting cannot fix every
death, so the supervisor gives up, and ``laya up`` stops everything, when

* a child exits with code 2: ``laya router`` and ``laya worker`` exit 2 when
  Laya refuses to start them (a bad config or routes file, a memory plan that
  refuses the model, a file that is not a model), and that is the same on
  every start;
* a child dies again after ``max_restarts`` restarts within ``window_s``: it
  fails faster than restarts help (a model that crashes llama.cpp as it
  loads, say), and saying so beats restarting it forever.

Children run in their own session, so a Ctrl-C in the terminal reaches only
``laya up``, which stops them in order; and with a parent-death signal
(:data:`ORPHAN_SIGNAL`), so they end even when ``laya up`` is SIGKILLed (see
:func:`die_with_parent`).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from laya.errors import ServerError

__all__ = ["ORPHAN_SIGNAL", "RestartPolicy", "Supervisor", "describe_exit", "die_with_parent"]

log = logging.getLogger("laya.ops.supervisor")

REFUSED_EXIT_CODE = 2
"""What ``laya router`` and ``laya worker`` exit with when Laya refuses to start them (see :func:`laya.cli.main`)."""

ORPHAN_SIGNAL = signal.SIGKILL
"""What a child gets when ``laya up`` dies without stopping it. Not SIGTERM: the embedded server
goes down at the same moment, so a graceful stop could neither write a result nor unregister,
and a worker told to stop just as its server vanished was seen retrying the connection instead
of exiting. A killed worker is a crash Laya recovers from: its job comes back by heartbeat (see
:mod:`laya.router.reaper`), a router's pending entries are claimed again, and ``laya up`` unregisters
dead workers from its own server when it next starts."""

_PR_SET_PDEATHSIG = 1


def describe_exit(returncode: int) -> str:
    """``killed by SIGSEGV (signal 11)`` or ``exited with code 1``, from a :class:`subprocess.Popen` return code."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "an unknown signal"
        return f"killed by {name} (signal {-returncode})"
    return f"exited with code {returncode}"


def die_with_parent(signum: signal.Signals) -> Callable[[], None] | None:
    """A ``preexec_fn`` for a child that must not outlive ``laya up``, even one SIGKILLed.

    It asks Linux to send the child ``signum`` when its parent dies. The
    kernel's parent-death signal rather than a pipe the child watches: it needs
    no code in the child, so it works for the Valkey binary as well as for the
    router and worker, and it survives ``exec`` (of binaries that are not
    setuid). Two limits: it is Linux only (elsewhere this returns None, and a
    stale server is found at the next start instead, see
    :class:`laya.ops.stack.EmbeddedValkey`), and it fires when the *thread* that
    started the child ends, so children are started from the main thread.
    ``preexec_fn`` is unsafe in a process with threads (the child may inherit a
    lock another thread held); ``laya up`` starts its children from its only thread.
    """
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here, not between fork and exec
    parent = os.getpid()

    def set_it() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the line above: no signal will come
            os._exit(1)

    return set_it


@dataclass(frozen=True, kw_only=True)
class RestartPolicy:
    first_delay_s: float = 1.0
    max_delay_s: float = 30.0
    max_restarts: int = 5
    """Restarts of one child within ``window_s``; its next death stops everything."""
    window_s: float = 60.0
    """Also how long a child must run for its delay to go back to ``first_delay_s``."""


@dataclass
class _Child:
    role: str
    command: Sequence[str]
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    failures: int = 0
    """Deaths since the child last ran for a whole ``window_s``: the next delay doubles with each."""
    restarts: deque[float] = field(default_factory=deque)
    restart_at: float | None = None


class Supervisor:
    """Starts ``laya ROLE`` children, restarts those that die, stops them on request.

    Non-blocking: :meth:`poll` does what is due and returns, so the caller's
    loop also watches for signals and for the server. It raises
    :class:`~laya.errors.ServerError`, one line naming the child, when it gives up.
    """

    def __init__(self, commands: Mapping[str, Sequence[str]], *, env: Mapping[str, str],
                 policy: RestartPolicy | None = None,
                 on_death: Callable[[str, int], None] | None = None,
                 role_env: Mapping[str, Mapping[str, str]] | None = None) -> None:
        self.children = {role: _Child(role, command) for role, command in commands.items()}
        self.env = dict(env)
        self.role_env = {role: dict(extra) for role, extra in (role_env or {}).items()}
        """Variables for one role only, on top of ``env`` (the worker's metrics port offset)."""
        self.policy = policy or RestartPolicy()
        self.on_death = on_death
        """Called with the role and pid of a child that died, or that :meth:`stop` had to kill."""

    def start(self) -> None:
        for child in self.children.values():
            self._spawn(child)

    def pid(self, role: str) -> int | None:
        """The running child's pid; None while it waits to be restarted."""
        proc = self.children[role].proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def poll(self) -> None:
        """Notice children that died (scheduling their restart, or giving up) and restart those due."""
        clock = time.monotonic()
        for child in self.children.values():
            if child.proc is not None and (code := child.proc.poll()) is not None:
                pid, child.proc = child.proc.pid, None
                if self.on_death is not None:
                    self.on_death(child.role, pid)
                self._schedule_restart(child, code, clock)
            if child.restart_at is not None and clock >= child.restart_at:
                child.restart_at = None
                child.restarts.append(clock)
                self._spawn(child)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM every child, wait up to ``timeout`` for all of them, SIGKILL what is left."""
        running = [c for c in self.children.values() if c.proc is not None and c.proc.poll() is None]
        for child in self.children.values():
            child.restart_at = None
        for child in running:
            assert child.proc is not None
            child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for child in running:
            assert child.proc is not None
            try:
                code = child.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("laya %s did not stop within %g s; killing it", child.role, timeout)
                child.proc.kill()
                code = child.proc.wait()
                if self.on_death is not None:
                    self.on_death(child.role, child.proc.pid)
            log.info("laya %s stopped (%s)", child.role, describe_exit(code))

    def _spawn(self, child: _Child) -> None:
        orphaned = die_with_parent(ORPHAN_SIGNAL)
        # Own session: a Ctrl-C in the terminal goes to `laya up` alone, which stops children in order.
        child.proc = subprocess.Popen(child.command, env={**self.env, **self.role_env.get(child.role, {})},
                                      start_new_session=True,
                                      preexec_fn=orphaned)  # noqa: PLW1509 - started from the only thread
        child.started_at = time.monotonic()
        log.info("laya %s started (pid %d)", child.role, child.proc.pid)

    def _schedule_restart(self, child: _Child, code: int, clock: float) -> None:
        policy = self.policy
        how = describe_exit(code)
        if code == REFUSED_EXIT_CODE:
            raise ServerError(f"laya {child.role} {how}: Laya refused to start it (the reason is in its log "
                              "above: a bad config, routes file or model, or a memory plan that refuses it); "
                              "restarting cannot fix that, so laya up stopped")
        while child.restarts and clock - child.restarts[0] > policy.window_s:
            child.restarts.popleft()
        if len(child.restarts) >= policy.max_restarts:
            raise ServerError(f"laya {child.role} {how} after {len(child.restarts)} restarts within "
                              f"{policy.window_s:g} s; look at its log above for why; laya up stopped")
        if clock - child.started_at >= policy.window_s:
            child.failures = 0
        delay = min(policy.max_delay_s, policy.first_delay_s * 2 ** child.failures)
        child.failures += 1
        child.restart_at = clock + delay
        log.warning("laya %s %s; restarting it in %g s (restart %d of at most %d within %g s)", child.role, how,
                    delay, len(child.restarts) + 1, policy.max_restarts, policy.window_s)
