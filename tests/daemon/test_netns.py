"""Four daemons on four network-namespace hosts joined by a bridge, with 10% random loss each way (iptables
statistic DROP rules): one identical total order everywhere; then one daemon is killed with -9 in mid-stream, the
others install a view without it within 45 s and go on, and every host's journal passes the simulator's checker.

Needs root (as in CI, where it must run, not skip).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from .harness import RMP, Daemon, wait_for
from .journals import check_journals

ROOT = Path(__file__).resolve().parents[2]
NETNS = str(ROOT / "scripts" / "netns")
HOSTS = 4
PER_SENDER = 1000

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root (CI runs this as root)")


@pytest.fixture
def hosts(tmp_path: Path):
    env = {**os.environ, "RMP_NETNS_PREFIX": f"rmpt{os.getpid() % 1000}x"}
    subprocess.run([NETNS, "up", str(HOSTS)], check=True, env=env, capture_output=True)
    started: list[Daemon] = []
    try:
        yield env, started
    finally:
        for daemon in started:
            daemon.stop(signal.SIGKILL, timeout=5)
        subprocess.run([NETNS, "down"], env=env, check=False)


def start_daemons(env: dict[str, str], started: list[Daemon], tmp_path: Path, journal: Path,
                  count: int) -> list[Daemon]:
    """One daemon on each of hosts 1..``count``, journaling, with joins that found a group in about a second."""
    config = tmp_path / "fast-join.toml"
    config.write_text("[timers]\nrequest_interval = 0.2\njoin_retries = 4\n")
    prefix = env["RMP_NETNS_PREFIX"]
    for i in range(1, count + 1):
        started.append(Daemon(tmp_path, f"h{i}", bind=f"10.77.0.{i}", journal=journal, netns=f"{prefix}{i}",
                              config=config))
    return started[-count:]


def listen(daemon: Daemon, group: str, count: int, out: Path) -> subprocess.Popen[bytes]:
    err = out.with_suffix(".err")
    proc = subprocess.Popen([RMP, "--socket", str(daemon.socket), "listen", group, "--count", str(count), "--json"],
                            stdout=out.open("wb"), stderr=err.open("wb"))
    wait_for(lambda: "listening on" in err.read_text() or proc.poll() is not None, 30, f"listener at {daemon.name}")
    assert proc.poll() is None, err.read_text()
    return proc


def send_lines(daemon: Daemon, group: str, lines: list[str]) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([RMP, "--socket", str(daemon.socket), "send", group, "--stdin", "--qos", "total"],
                            stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin is not None
    proc.stdin.write("".join(f"{line}\n" for line in lines).encode())
    proc.stdin.close()
    return proc


def membership_story(journal: Path, daemons: list[Daemon]) -> str:
    """Each daemon's members now, the views it installed and its reformation steps, and the end of its log: what
    a failed wait for a view needs to be understood."""
    lines = []
    for daemon in daemons:
        lines.append(f"== {daemon.name} ({daemon.pid}): members now {daemon.members('ring')}")
        for path in sorted(journal.glob(f"{daemon.pid.replace(':', '_')}.*.jsonl")):
            for raw in path.read_text().splitlines():
                record = json.loads(raw)
                if record["event"] in ("view", "recovery"):
                    lines.append(f"  {record['mono']:.2f} {record['event']} {record.get('role', '')} "
                                 f"v{record.get('version', '')} {record.get('members', '')} {record.get('reason', '')}")
        lines.extend("  log: " + line for line in daemon.log_path.read_text().splitlines()[-10:])
    return "\n".join(lines)


def deliveries(path: Path) -> list[tuple[str, int, int, str]]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [(r["src"], r["seq"], r["ts"], r["payload"]) for r in rows]


def test_four_hosts_with_loss_then_a_crash(hosts, tmp_path: Path) -> None:
    env, started = hosts
    journal = tmp_path / "journal"
    ds = start_daemons(env, started, tmp_path, journal, HOSTS)
    subprocess.run([NETNS, "loss", "0.1"], check=True, env=env)
    for d in ds:
        d.rmp("join", "ring", timeout=120)
    try:
        wait_for(lambda: all(len(d.members("ring")) == HOSTS for d in ds), 60, "a four-member view at every host")
    except AssertionError:
        print(membership_story(journal, ds))
        raise

    # Phase 1: two senders, identical order at all four hosts under loss.
    outs = [tmp_path / f"phase1-{d.name}.jsonl" for d in ds]
    listeners = [listen(d, "ring", 2 * PER_SENDER, out) for d, out in zip(ds, outs, strict=True)]
    senders = [send_lines(ds[0], "ring", [f"a{i}" for i in range(PER_SENDER)]),
               send_lines(ds[1], "ring", [f"b{i}" for i in range(PER_SENDER)])]
    for proc in senders + listeners:
        assert proc.wait(180) == 0
    first = deliveries(outs[0])
    assert len(first) == 2 * PER_SENDER and len({p for *_, p in first}) == 2 * PER_SENDER
    for out in outs[1:]:
        assert deliveries(out) == first

    # Phase 2: kill -9 host 4 while both senders stream; the others go on without it.
    survivors, victim = ds[:3], ds[3]
    outs = [tmp_path / f"phase2-{d.name}.jsonl" for d in survivors]
    listeners = [listen(d, "ring", 2 * PER_SENDER, out) for d, out in zip(survivors, outs, strict=True)]
    senders = [send_lines(ds[0], "ring", [f"c{i}" for i in range(PER_SENDER)]),
               send_lines(ds[1], "ring", [f"d{i}" for i in range(PER_SENDER)])]
    wait_for(lambda: outs[2].exists() and len(outs[2].read_text().splitlines()) >= 50, 60, "traffic in mid-stream")
    victim.proc.kill()
    # How fast is measured by `rmp sim` (detection_seconds); here, that it happens.  Suspicion alone takes 4.6 s
    # (ten expiries from 5 ms, clamped at 2 s); under 10% loss on a loaded machine the whole removal once took
    # longer than the 20 s this test used to allow.
    try:
        wait_for(lambda: all(victim.pid not in d.members("ring") and len(d.members("ring")) == 3 for d in survivors),
                 45, "a view without the killed host at every survivor", interval=0.2)
    except AssertionError:
        print(membership_story(journal, survivors))
        raise
    for proc in senders + listeners:
        assert proc.wait(180) == 0
    second = deliveries(outs[0])
    assert len(second) == 2 * PER_SENDER
    for out in outs[1:]:
        assert deliveries(out) == second

    for d in survivors:
        assert d.stop() == 0
    checker, violations = check_journals(journal, "ring")
    assert checker.delivered_count > 0
    assert not violations, violations[:5]


def test_a_partition_of_one_host_from_two_heals_into_one_view(hosts, tmp_path: Path) -> None:
    """Host 3 is cut off from hosts 1 and 2: the two go on without it and it goes on alone (minimum partition 1).
    Once the partition heals, the smaller view merges into the larger one, with nothing typed."""
    env, started = hosts
    journal = tmp_path / "journal"
    ds = start_daemons(env, started, tmp_path, journal, 3)
    for d in ds:
        d.rmp("join", "ring", timeout=120)
    pids = sorted(d.pid for d in ds)
    try:
        wait_for(lambda: all(sorted(d.members("ring")) == pids for d in ds), 60, "a view of three")
        subprocess.run([NETNS, "partition", "3", "--", "1", "2"], check=True, env=env)
        wait_for(lambda: all(sorted(d.members("ring")) == sorted([ds[0].pid, ds[1].pid]) for d in ds[:2])
                 and ds[2].members("ring") == [ds[2].pid], 60, "two views: hosts 1 and 2, and host 3 alone")
        subprocess.run([NETNS, "heal"], check=True, env=env)
        wait_for(lambda: all(sorted(d.members("ring")) == pids for d in ds), 30, "one view of three after the heal")
    except AssertionError:
        print(membership_story(journal, ds))
        raise
    assert len({d.rmp_json("members", "ring")["view"] for d in ds}) == 1


def block_multicast(env: dict[str, str], host: int) -> None:
    """The host neither sends nor receives multicast (iptables in its namespace)."""
    netns = f"{env['RMP_NETNS_PREFIX']}{host}"
    for chain in ("OUTPUT", "INPUT"):
        subprocess.run(["ip", "netns", "exec", netns, "iptables", "-A", chain, "-d", "224.0.0.0/4", "-j", "DROP"],
                       check=True)


def test_hosts_without_multicast_take_part_through_a_named_member(hosts, tmp_path: Path) -> None:
    """The forwarding flag and explicit naming (paper 3.3, 3.4) on hosts whose multicast is blocked: host 3, a member,
    and host 4, a non-member that calls the group, name host 1, which multicasts what they send.  Host 3 delivers
    the same order as hosts 1 and 2, the non-member's messages among them."""
    env, started = hosts
    journal = tmp_path / "journal"
    block_multicast(env, 3)
    block_multicast(env, 4)
    first, second = start_daemons(env, started, tmp_path, journal, 2)
    config = tmp_path / "fast-join.toml"
    prefix = env["RMP_NETNS_PREFIX"]
    relayed = [Daemon(tmp_path, f"h{i}", bind=f"10.77.0.{i}", journal=journal, netns=f"{prefix}{i}", config=config,
                      extra=["--no-multicast", "--via", first.pid]) for i in (3, 4)]
    started.extend(relayed)
    member, outsider = relayed
    first.rmp("join", "fwd", timeout=120)
    second.rmp("join", "fwd", "--existing", timeout=120)
    member.rmp("join", "fwd", "--existing", timeout=120)
    ds = [first, second, member]
    wait_for(lambda: all(len(d.members("fwd")) == 3 for d in ds), 60, "a view of hosts 1, 2 and 3")
    count = 2 * 50 + 5
    outs = [tmp_path / f"fwd-{d.name}.jsonl" for d in ds]
    listeners = [listen(d, "fwd", count, out) for d, out in zip(ds, outs, strict=True)]
    senders = [send_lines(second, "fwd", [f"b{i}" for i in range(50)]),
               send_lines(member, "fwd", [f"c{i}" for i in range(50)])]
    # Host 3 has just joined: its own call filter's floor is still ahead, but every member follows the relay's
    # verdict (docs/protocol.md, "Non-members and SCMP"), so the calls reach all three.
    for i in range(5):
        outsider.rmp("call", "fwd", f"outside{i}", "--no-handler", timeout=60)
    for proc in senders + listeners:
        assert proc.wait(120) == 0
    order = deliveries(outs[0])
    payloads = {p for *_, p in order}
    assert len(order) == count and {"c0", "c49", "outside0", "outside4"} <= payloads
    for out in outs[1:]:
        assert deliveries(out) == order
    assert first.counters()["forwarded"] > 0
    assert member.counters().get("datagrams_received_multicast", 0) == 0
