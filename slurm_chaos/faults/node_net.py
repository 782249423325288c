"""Network degradation on the node: ``tc netem`` delay, jitter, loss and rate on its job interface.

The interface is the site's, never the job's: the policy's ``job_interface`` (from the site
config's ``safety.job_interface``), the one the jobs' traffic uses. Without it netem is refused,
so the management interface (or whatever carries the default route) is shaped only where the
site itself names it. The prolog runs in slurmd's network namespace, so the qdisc lands on the
node's own interface.
netem shapes egress only: a delay D on node A adds D to every round trip between A and others.

A root qdisc shapes every job's traffic on the interface, so netem acts only for a job that holds
the node alone, as slurmctld told the prolog (``JobContext.exclusive``), whatever the policy's
``require_exclusive`` says. Each job's qdisc has a handle of its own (:func:`qdisc_handle`), which
the journal records with the kinds it may have: slurm-chaos adds a root qdisc only where the
kernel's default is (``tc qdisc add`` never replaces one), and deletes one only by that handle
(``tc qdisc del ... root handle H:``, which the kernel refuses for any other root qdisc) and only
when its kind is ours too; anything else on the interface (another job's, an administrator's) is
left, with the reason logged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from slurm_chaos.errors import ChaosError
from slurm_chaos.faults.journal import Json, Undo, UndoContext, UndoFailed, undo_action
from slurm_chaos.faults.node_base import Controller, JobContext, applies, check, log, num, switchback
from slurm_chaos.faults.spec import FaultRequest

#: Our handles: one major per job id in 4000:..7fff:, above the small numbers administrators pick
#: (1:, 10:, 100:, 1000:), below the ones the kernel picks itself (8000: and up; ffff: for ingress),
#: never 0: (the kernel's default root qdisc).
HANDLE_BASE = 0x4000
HANDLE_SPAN = 0x4000
#: The one handle of journals written before handles were per job.
LEGACY_HANDLE = "cafe:"
#: netem, or tbf where the kernel lacks sch_netem and only a rate limit can be had.
OUR_KINDS = frozenset({"netem", "tbf"})

#: Root qdiscs the kernel sets up by itself: deleting ours brings one of these back.
DEFAULT_KINDS = frozenset({"noqueue", "pfifo_fast", "mq", "fq_codel", "fq", "pfifo", "sfq", "cake"})


@dataclass(frozen=True)
class RootQdisc:
    """The root qdisc of an interface as `tc qdisc show` prints it."""

    kind: str
    handle: str
    line: str

    def ours(self, handle: str, kinds: frozenset[str] = OUR_KINDS) -> bool:
        """Whether this is the qdisc a job installed: its handle and one of the kinds it may have."""
        return self.handle == handle and self.kind in kinds

    @property
    def default(self) -> bool:
        # The kernel's own root qdisc has handle 0: (noqueue) or one it numbered itself.
        return self.kind in DEFAULT_KINDS


def qdisc_handle(job_id: str) -> str:
    """The handle of a job's root qdisc, as tc prints it ('4d2:')."""
    if not job_id.isdigit():
        raise ChaosError(f"netem: job id {job_id!r} is not a number")
    return f"{HANDLE_BASE + int(job_id) % HANDLE_SPAN:x}:"


def root_qdisc(show: str) -> RootQdisc | None:
    """The root qdisc in `tc qdisc show dev IF` output ('qdisc noqueue 0: root refcnt 2')."""
    for line in show.splitlines():
        words = line.split()
        if len(words) >= 4 and words[0] == "qdisc" and "root" in words[3:]:
            return RootQdisc(words[1], words[2], line.strip())
    return None


def netem_args(req: FaultRequest) -> list[str]:
    """netem parameters for the request: delay [jitter], loss, rate (bytes/s, 'bps' in tc)."""
    delay_ms = num(req, "delay") * 1000.0
    jitter_ms = num(req, "jitter") * 1000.0
    args = ["delay", f"{delay_ms:g}ms"]
    if jitter_ms > 0:
        args.append(f"{jitter_ms:g}ms")
    loss = num(req, "loss")
    if loss > 0:
        args += ["loss", f"{loss:g}%"]
    rate = req.get("rate")
    if rate is not None:
        args += ["rate", f"{int(num(req, 'rate'))}bps"]
    return args


def _show(ctx_runner: UndoContext | JobContext, iface: str) -> tuple[bool, str]:
    res = ctx_runner.runner(["tc", "qdisc", "show", "dev", iface], timeout=10)
    return res.ok, res.stdout if res.ok else res.stderr


def job_interface(ctx: JobContext) -> str:
    """The interface netem may shape on this node; ChaosError when the site named none."""
    if not ctx.job_interface:
        raise ChaosError(
            "netem: the policy names no job_interface (set safety.job_interface in the site config and "
            "run 'slurm-chaos plugin install'): slurm-chaos shapes only the interface the site names"
        )
    return ctx.job_interface


def require_exclusive(ctx: JobContext) -> None:
    """ChaosError unless the job holds the node alone: a node-wide fault acts on every job there."""
    if not ctx.exclusive:
        raise ChaosError(
            f"netem: job {ctx.job_id} does not hold {ctx.node} exclusively (submit with --exclusive): "
            "a qdisc on the job interface shapes every job's traffic there, whatever require_exclusive says"
        )


@applies("netem")
def apply_netem(req: FaultRequest, ctx: JobContext) -> list[Controller]:
    require_exclusive(ctx)
    iface = job_interface(ctx)
    handle = qdisc_handle(ctx.job_id)
    ok, out = _show(ctx, iface)
    if not ok:
        raise ChaosError(f"netem: cannot read the qdiscs of {iface}: {out.strip()}")
    before = root_qdisc(out)
    if before is not None and not before.default:
        raise ChaosError(
            f"netem: {iface} already has root qdisc '{before.line}'; slurm-chaos does not replace "
            "a qdisc it did not create (run 'slurm-chaos cleanup' if it is a leftover of ours)"
        )
    argv = ["tc", "qdisc", "add", "dev", iface, "root", "handle", handle, "netem", *netem_args(req)]
    data: dict[str, Json] = {
        "iface": iface,
        "before": before.kind if before else "",
        "handle": handle,
        "kinds": [kind for kind in sorted(OUR_KINDS)],
    }
    ctx.journal.record(
        req.name,
        " ".join(argv) + " (or tbf for the rate alone where the kernel lacks netem)",
        Undo(action="tc_restore", data=data),
        ctx.deadline,
    )
    if switchback(req):
        # Off until the job asks: the qdisc is added when switched on, deleted when switched off.
        toggle = QdiscToggle(req.name, ctx, iface, argv, handle)
        toggle.probe_kind(req)
        return [toggle]
    res = ctx.runner(argv, timeout=10)
    if not res.ok and "kind is unknown" in res.stderr:
        return _without_netem(req, ctx, iface, handle)
    check(res.ok, " ".join(argv), res.stderr)
    return []


@dataclass
class QdiscToggle:
    """netem (or tbf) that a switchback job turns on and off: one tc call per change.

    Off is the interface's default qdisc (ours deleted), on is ours added again, so an off block
    is exactly the unfaulted interface; the journal's ``tc_restore`` removes ours whatever state
    the job left it in. Neither replaces nor deletes a root qdisc of another handle: a switch that
    finds one fails, and the job is told.
    """

    name: str
    ctx: JobContext
    iface: str
    argv: list[str]
    handle: str
    on: bool = False

    def probe_kind(self, req: FaultRequest) -> None:
        """Add and delete ours once now: a kernel without sch_netem falls back to tbf here, not
        in the middle of the job's first on block; and an error is reported before the job."""
        res = self.ctx.runner(self.argv, timeout=10)
        if not res.ok and "kind is unknown" in res.stderr:
            _without_netem(req, self.ctx, self.iface, self.handle)
            head = self.argv[: self.argv.index("netem")]
            self.argv = [*head, "tbf", *tbf_args(int(num(req, "rate")))]
        else:
            check(res.ok, " ".join(self.argv), res.stderr)
        self._delete()

    def _delete(self) -> None:
        argv = ["tc", "qdisc", "del", "dev", self.iface, "root", "handle", self.handle]
        res = self.ctx.runner(argv, timeout=10)
        check(res.ok, " ".join(argv), res.stderr)

    def switch(self, on: bool, now: float) -> None:
        if on == self.on:
            return
        if on:
            res = self.ctx.runner(self.argv, timeout=10)
            check(res.ok, " ".join(self.argv), res.stderr)
        else:
            self._delete()
        self.on = on

    def tick(self, now: float) -> float:
        return float("inf")

    def stop(self) -> None:
        """Nothing: the journal's ``tc_restore`` deletes our qdisc."""


def tbf_args(rate: int) -> list[str]:
    """tbf rate limit: a burst of 1/100 s of traffic (at least 32 KiB), a queue of 1 s."""
    return ["rate", f"{rate}bps", "burst", str(max(32768, rate // 100)), "latency", "1s"]


def _without_netem(req: FaultRequest, ctx: JobContext, iface: str, handle: str) -> list[Controller]:
    # Some kernels ship without sch_netem (CONFIG_NET_SCH_NETEM unset): a rate limit is still real
    # (tbf); delay, jitter and loss are not faked, and the log says so.
    lost = [k for k in ("delay", "jitter", "loss") if num(req, k) > 0]
    rate = req.get("rate")
    if lost:
        log.error("netem: the kernel of %s has no sch_netem: %s not applied", ctx.node, ", ".join(lost))
    if rate is None:
        raise ChaosError(
            f"netem: the kernel of {ctx.node} has no sch_netem (CONFIG_NET_SCH_NETEM); nothing applied"
        )
    argv = [
        "tc",
        "qdisc",
        "add",
        "dev",
        iface,
        "root",
        "handle",
        handle,
        "tbf",
        *tbf_args(int(num(req, "rate"))),
    ]
    res = ctx.runner(argv, timeout=10)
    check(res.ok, " ".join(argv), res.stderr)
    log.info("netem: no sch_netem on %s: rate limit only: %s", ctx.node, " ".join(argv))
    return []


@undo_action("tc_restore")
def _tc_restore(data: Mapping[str, Json], ctx: UndoContext) -> str:
    """Delete our root qdisc, by its handle; the kernel puts its default back. Harmless when it is
    gone already; any other root qdisc is left (the outcome says why)."""
    iface = str(data["iface"])
    handle = str(data.get("handle", LEGACY_HANDLE))
    kinds = data.get("kinds")
    ours = frozenset(str(k) for k in kinds) if isinstance(kinds, list) else OUR_KINDS
    ok, out = _show(ctx, iface)
    if not ok:
        return f"{iface} is gone ({out.strip()[:100]})"
    now = root_qdisc(out)
    if now is None or now.default:
        return f"{iface}: root qdisc is {now.kind if now else 'none'}: nothing of ours to undo"
    if not now.ours(handle, ours):
        mine = f"{'/'.join(sorted(ours))} {handle}"
        return f"{iface}: root qdisc is '{now.line}', not ours ({mine}): left as it is"
    argv = ["tc", "qdisc", "del", "dev", iface, "root", "handle", handle]
    res = ctx.runner(argv, timeout=10)
    ok, out = _show(ctx, iface)
    after = root_qdisc(out) if ok else None
    if after is not None and after.ours(handle, ours):
        raise UndoFailed(f"{iface}: our {after.kind} qdisc {handle} is still there ({res.stderr.strip()})")
    if not res.ok:  # gone or replaced since we looked: the kernel deletes by the handle only
        now_is = f"'{after.line}'" if after else "none"
        return f"{iface}: root qdisc is {now_is}, not ours ({handle}): left as it is"
    return f"{' '.join(argv)} (now {after.kind if after else 'none'})"
