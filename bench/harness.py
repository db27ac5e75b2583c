"""The measuring harness shared by the bench drivers: subprocess workers with their JSON result,
the CPU share other processes took meanwhile, waiting for a quiet machine, peak RSS, `perf`
attribution, the report footer, and where the upstream codec source is. (bench/upstream_codec.py
runs in a torch venv without this package and keeps its own timing.)"""

from __future__ import annotations

import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RETRY_FOREIGN = 0.10   # re-measure when other processes took more than this share of the CPUs
RETRIES = 2
UPSTREAM_ENV = "MOSS_TTS_UPSTREAM_CODEC"
UPSTREAM_WHAT = ("the upstream MOSS-Audio-Tokenizer code and config.json: a clone of GitHub "
                 "OpenMOSS/MOSS-Audio-Tokenizer, or the files of the Hugging Face repo "
                 "OpenMOSS-Team/MOSS-Audio-Tokenizer without the weights")


@dataclass(frozen=True)
class Upstream:
    """Where one upstream model's source comes from: the environment variable naming the
    checkout (when --upstream-src is not given), what it should hold (for the error), and the
    folders inside it where the files sit, tried in order (a model's own repository has them at
    the top; a mirror that bundles several models keeps each in a subfolder)."""

    env: str
    what: str
    dirs: tuple[str, ...] = ("",)


CODEC_V1 = Upstream(UPSTREAM_ENV, UPSTREAM_WHAT)
NANO_CODEC = Upstream(
    "MOSS_TTS_UPSTREAM_NANO_CODEC",
    "the upstream MOSS-Audio-Tokenizer-Nano code (48 kHz stereo): the files of the Hugging Face repo "
    "OpenMOSS-Team/MOSS-Audio-Tokenizer-Nano without the weights, or a checkout of GitHub "
    "ml-inory/moss-tts-nano.axera (models/codec/hf_code/)",
    ("", "models/codec/hf_code"))
NANO_TTS = Upstream(
    "MOSS_TTS_UPSTREAM_NANO",
    "the upstream MOSS-TTS-Nano code (modeling_moss_tts_nano.py, gpt2_decoder.py, ...): the files "
    "of the Hugging Face repo OpenMOSS-Team/MOSS-TTS-Nano without the weights, or a checkout of "
    "GitHub ml-inory/moss-tts-nano.axera (models/llm/repo/)",
    ("", "models/llm/repo"))


def peak_rss_gb() -> float:
    """VmHWM: the peak resident set, file-backed (mmapped weights) pages included."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024 / 1e9
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def process_cpu_s(pid: int) -> float:
    """User + system seconds of a running process, all its threads (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Contention:
    """CPU time the rest of the machine used while we measured, as a share of all cores: this
    machine is shared, and ggml's spinning threads slow down badly when a core is taken.
    `children`: our waited-for child processes' time is ours too (a group of workers run
    together, measured from the driver once they ended); `pids`: so is these running
    processes' (a child never waited for while measured: bench/serve_bench.py's server)."""

    def __init__(self, *, children: bool = False, pids: tuple[int, ...] = ()):
        self.children, self.pids = children, pids
        self.t, self.busy, self.own = self._snap()

    def _snap(self):
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
        busy = (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")
        t = os.times()
        own = t.user + t.system + (t.children_user + t.children_system if self.children else 0)
        return time.perf_counter(), busy, own + sum(map(process_cpu_s, self.pids))

    def share(self) -> float:
        t, busy, own = self._snap()
        # /proc/stat counts in clock ticks (10 ms): over a shorter span one tick would read as
        # many cores' worth, so the share is clamped to what the cores can give
        foreign = max(0.0, (busy - self.busy) - (own - self.own))
        return min(1.0, foreign / ((t - self.t) * os.cpu_count()))


def timed_runs(fn, runs: int):
    """First call (cold: graph build + first touch of the weights) + `runs` warm calls; per call
    the total, the per-chunk times (from the progress callback) and the foreign CPU share."""
    totals, chunks, foreign, out = [], [], [], None
    for _ in range(runs + 1):
        c = Contention()
        marks = [time.perf_counter()]
        out = fn(lambda done, total, marks=marks: marks.append(time.perf_counter()))
        end = time.perf_counter()
        foreign.append(c.share())
        totals.append(end - marks[0])
        chunks.append(list(np.diff(marks)))
    return totals, chunks, foreign, out


PREFILL_RUNS = 3


def prefill_times(prefill, runs: int = PREFILL_RUNS) -> dict:
    """A prompt's prefill timed cold and warm: `prefill()` runs it once on a fresh state. The
    first call pays the first touch of the mmapped weights (page faults, disk reads when the
    file is not cached: what a fresh process's first utterance sees); the median of `runs`
    more is the compute-bound figure to hold against a peer whose weights sit in RAM. Where
    the prefill runs ggml graphs, `prefill_gflop` is the work of one (count_flops), counted on
    the cold call only: a fresh state builds fresh graphs, whose node walk (about 1 ms) stays
    out of the warm times."""
    times, cold_work = [], None
    for i in range(runs + 1):
        with counting() if i == 0 else nullcontext() as work:
            t0 = time.perf_counter()
            prefill()
            times.append(time.perf_counter() - t0)
        if i == 0:
            cold_work = work
    out = {"prefill_cold_ms": 1e3 * times[0], "prefill_ms": 1e3 * median(times[1:])}
    if cold_work is not None and cold_work.runs:
        out["prefill_gflop"] = cold_work.total / 1e9
    return out


@contextmanager
def counting():
    """moss_tts.ggml.count_flops where the package imports (None in a peer's venv without it)."""
    try:
        from moss_tts.ggml import count_flops
    except ImportError:
        yield None
        return
    with count_flops() as work:
        yield work


def gflop_per_call(work, calls: int) -> dict:
    """A count_flops total over `calls` equal calls → GFLOP per call by kind."""
    return {k: v / max(1, calls) for k, v in work.gflop().items()}


def measure_peak(driver: "Driver", threads: int) -> dict:
    """The host's f32 GEMM peak now, in a fresh process (`bench/matmul.py --peak-only`): the
    best of numpy's BLAS and ggml at n = 2048, and the FMA-width × clock × cores figure. Kept
    on the driver for the report. This host's speed drifts by up to 2× within minutes, so the
    drivers probe at the start and again before the report: the best of the probes is the
    peak, and every probe is listed."""
    got = driver.run([sys.executable, "bench/matmul.py", "--peak-only", "--threads", str(threads)])
    old = getattr(driver, "peak", None)
    if "peak" not in got:
        driver.peak = old or got
    elif old is None or "peak" not in old:
        driver.peak = got | {"probes": [got["peak"]]}
    else:
        best = max(old, got, key=lambda p: p["peak"])
        driver.peak = best | {"probes": old["probes"] + [got["peak"]]}
    return got


def of_peak(gflop, seconds, peak: dict | None) -> str:
    """'GFLOP/s (% of the measured peak)' of `gflop` done in `seconds`; '' when unknown."""
    if not gflop or not seconds or seconds != seconds:
        return ""
    rate = gflop / seconds
    best = (peak or {}).get("peak")
    return f"{rate:.0f}" + (f" ({100 * rate / best:.0f} %)" if best else "")


def peak_line(peak: dict | None) -> str:
    if not peak or "peak" not in peak:
        return f"peak: not measured ({(peak or {}).get('error', 'skipped')})"
    probes = peak.get("probes", [peak["peak"]])
    return (f"peak: measured f32 GEMM n={peak['n']}, best probe: numpy {peak['numpy']:.0f}, ggml "
            f"{peak['ggml']:.0f} GFLOP/s (probes at start and end: "
            f"{', '.join(f'{p:.0f}' for p in probes)}); FMA figure {peak['fma']:.0f} ({peak['how']}); "
            f"'% of peak' uses the measured {peak['peak']:.0f}")


def run_worker(cmd: list[str], line: str, say) -> dict:
    """One measuring subprocess: its last stdout line is its JSON result (+ wall_s)."""
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    if p.returncode != 0:
        say(f"FAILED ({p.returncode}): {line}\n{p.stderr[-3000:]}")
        return {"error": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "failed"}
    out = json.loads(p.stdout.strip().splitlines()[-1])
    out["wall_s"] = time.perf_counter() - t0
    return out


def fmt(x, fmt="{:.2f}"):
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


# --- the shared machine -------------------------------------------------------------------------


def _proc_table() -> dict[int, tuple[int, str]]:
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = Path(f"/proc/{d}/stat").read_text()
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        except (OSError, ValueError):
            continue
        out[int(d)] = (ppid, cmd.strip())
    return out


def other_bench_processes() -> list[str]:
    """`bench/` processes that are neither our ancestors nor our descendants."""
    procs = _proc_table()
    mine, p = set(), os.getpid()
    while p in procs and p not in mine:
        mine.add(p)
        p = procs[p][0]
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    stack = [os.getpid()]
    while stack:
        q = stack.pop()
        for c in children.get(q, []):
            if c not in mine:
                mine.add(c)
                stack.append(c)
    return [f"{pid}: {cmd[:140]}" for pid, (_, cmd) in sorted(procs.items())
            if pid not in mine and "bench/" in cmd and "python" in cmd]


def foreign_share(seconds: float = 2.0) -> float:
    c = Contention()
    time.sleep(seconds)
    return c.share()


class Quiet:
    """Wait before a timing run until no other bench/ process runs and the CPUs are idle
    (foreign share ≤ max_share); keeps a log of what it saw. `enabled=False` (--no-wait) never
    waits: a test or a quick look must finish on a busy machine too."""

    def __init__(self, say, max_share: float = 0.15, max_wait_s: float = 3600.0, *,
                 enabled: bool = True):
        self.say, self.max_share, self.max_wait_s = say, max_share, max_wait_s
        self.enabled = enabled
        self.seen: list[str] = []
        self.waited_s = 0.0

    def wait(self) -> None:
        if not self.enabled:
            return
        t0 = time.perf_counter()
        announced = False
        while time.perf_counter() - t0 < self.max_wait_s:
            others = other_bench_processes()
            share = foreign_share(1.0) if not others else None
            if not others and share <= self.max_share:
                break
            msg = (f"other bench process(es): {'; '.join(others)}" if others
                   else f"other processes use {100 * share:.0f} % of the CPUs")
            if msg not in self.seen:
                self.seen.append(msg)
            if not announced:
                self.say(f"  waiting: {msg}")
                announced = True
            time.sleep(10)
        self.waited_s += time.perf_counter() - t0


# --- perf attribution (optional: needs linux `perf`) ----------------------------------------------


def perf_top(cmd: list[str], data: Path, n: int = 14) -> list[str]:
    """`perf record -g` a command, then the top-n symbols by self time (all threads):
    "pct% dso symbol". Empty when perf is missing or not permitted."""
    import shutil

    if not shutil.which("perf"):
        return ["(perf not installed)"]
    rec = subprocess.run(["perf", "record", "-F", "2000", "-g", "-o", str(data), "--", *cmd],
                         cwd=ROOT, capture_output=True, text=True, check=False)
    if rec.returncode != 0:
        return [f"(perf record failed: {rec.stderr.strip().splitlines()[-1:]})"]
    rep = subprocess.run(["perf", "report", "-i", str(data), "--no-children", "--sort", "dso,symbol",
                          "--stdio"], cwd=ROOT, capture_output=True, text=True, check=False)
    out = []
    for line in rep.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[0].endswith("%") and not line.lstrip().startswith(("|", "-")):
            sym = " ".join(parts[3:]).replace("(anonymous namespace)::", "").removesuffix(" - -")
            out.append(f"{parts[0]:>7} {parts[1]:<22.22} {sym[:90]}")
        if len(out) >= n:
            break
    return out


# --- the report: the pieces every driver's report shares ------------------------------------------


def the_command() -> str:
    """This driver's own command line, as run."""
    return " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv])


def start_line(script: str) -> str:
    """The log's first line of a run: the driver, when, and its arguments."""
    return f"=== {script} {time.strftime('%Y-%m-%d %H:%M:%S')}: " + \
        " ".join(shlex.quote(a) for a in sys.argv)


def other_load(*results: dict) -> str:
    """The "other load %" of one or more results, '/'-joined: the CPU share other processes took
    while each was measured (Contention)."""
    return "/".join(fmt(100 * r.get("foreign", math.nan), "{:.0f}") for r in results)


def rtf(seconds: float, *results: dict) -> str:
    """Real-time factors, '/'-joined: each result's warm median over the audio's seconds."""
    return "/".join(fmt(r.get("median_s", math.nan) / seconds, "{:.3f}") for r in results)


def timed_convert(convert, checkpoint: Path, out: Path, outtype: str) -> dict:
    """A convert worker's result, as conversion_lines reports it: `convert` of the checkpoint
    to `out` timed, the file's bytes, the process's peak RSS."""
    t0 = time.perf_counter()
    path = convert(str(checkpoint), out, outtype=outtype)
    return {"seconds": time.perf_counter() - t0, "bytes": path.stat().st_size,
            "peak_rss_gb": peak_rss_gb()}


def conversion_lines(conv: dict) -> list[str]:
    """The conversions this run made: what (a type, or a (variant, type) pair) → the convert
    worker's result."""
    if not conv:
        return []
    return ["### conversion (this run)",
            *(f"- {' '.join(what) if isinstance(what, tuple) else what}: "
              f"{fmt(r.get('seconds'), '{:.1f}')} s, {fmt(r.get('bytes', 0) / 1e9)} GB, peak RSS "
              f"{fmt(r.get('peak_rss_gb'))} GB" for what, r in conv.items()), ""]


def run_lines(total_s: float, commands: list[str]) -> list[str]:
    """The bench's time and every command it ran."""
    return [f"total bench time {total_s / 60:.1f} min", "### commands (cwd: the repository root)",
            *(f"    {c}" for c in commands)]


def report_footer(d: "Driver", total_s: float, conv: dict | None = None) -> list[str]:
    """The report's last lines: the conversions this run made (`conv`), the CPU, the other load
    seen, the bench time, every command run."""
    from bench.common import cpu_line

    return [*conversion_lines(conv or {}), f"CPU: {cpu_line()}", peak_line(getattr(d, "peak", None)),
            f"other load: waited {d.quiet.waited_s:.0f} s in total for a quiet machine; seen: "
            + ("; ".join(d.quiet.seen) if d.quiet.seen else "nothing"),
            *run_lines(total_s, [the_command(), *d.commands])]


def publish(d, report: str, path: Path) -> None:
    """The finished report: said (the log keeps it) and written to `path`."""
    d.say(report)
    path.write_text(report + "\n")


def end_report(d, results: list[dict] | None = None) -> None:
    """A model bench's last words: the command that ran it; then `results`, when given, as JSON
    on stdout (its last line, for a caller)."""
    d.say(f"command: {the_command()}")
    if results is not None:
        print(json.dumps(results))


def add_no_wait(ap) -> None:
    """--no-wait, the same in every bench: what a test passes so that it never waits."""
    ap.add_argument("--no-wait", action="store_true",
                    help="never wait for a quiet machine, nor measure again when it was busy")


class Driver:
    """Runs `script --worker MODE ...` subprocesses after waiting for a quiet machine, logs what
    they print, and keeps every command for the report. With args.no_wait it never waits and
    never re-measures, whatever a caller asks (`timing=True` is the default of every run)."""

    def __init__(self, args, log_path: Path, script: Path):
        self.args = args
        self.script = Path(script).resolve()
        self.commands: list[str] = []
        self.log_path = log_path
        self.no_wait = bool(getattr(args, "no_wait", False))
        self.quiet = Quiet(self.say, enabled=not self.no_wait)

    def say(self, msg: str) -> None:
        print(msg, flush=True)
        with open(self.log_path, "a") as f:
            f.write(msg + "\n")

    def worker(self, mode: str, *, timing: bool = True, **kw) -> dict:
        cmd = [sys.executable, str(self.script.relative_to(ROOT)), "--worker", mode]
        for k, v in kw.items():
            if v is True:
                cmd.append(f"--{k}")
            elif v is not None and v is not False:
                cmd += [f"--{k}", str(v)]
        return self.run(cmd, timing=timing)

    def run(self, cmd: list[str], *, timing: bool = True) -> dict:
        """A measuring subprocess, after waiting for a quiet machine; measured again when other
        processes still took > 10 % of the CPUs (keeping the less disturbed result)."""
        line = " ".join(shlex.quote(c) for c in cmd)
        self.commands.append(line)
        timing = timing and not self.no_wait
        out = None
        for _ in range(RETRIES + 1):
            if timing:
                self.quiet.wait()
            again = self._run(cmd, line)
            if out is None or again.get("foreign", 1) < out.get("foreign", 1):
                out = again
            if not timing or out.get("foreign", 0) <= RETRY_FOREIGN or "error" in out:
                break
            self.say(f"  (other processes used {100 * out['foreign']:.0f} % of the CPUs: again)")
        return out

    def _run(self, cmd, line) -> dict:
        return run_worker(cmd, line, self.say)


# --- the upstream source (never a fixed path of one machine) --------------------------------------


def upstream_source(path: str | None, kind: Upstream = CODEC_V1) -> Path:
    """The upstream checkout: `path` (from --upstream-src), else the kind's environment variable."""
    value = path or os.environ.get(kind.env)
    if not value:
        raise SystemExit(f"no upstream source: pass --upstream-src DIR or set {kind.env}=DIR, "
                         f"DIR holding {kind.what}")
    src = Path(value).expanduser()
    if not src.is_dir():
        raise SystemExit(f"{src}: not a directory; it should hold {kind.what}")
    return src


def upstream_file(src: Path, name: str, kind: Upstream = CODEC_V1) -> str:
    """`name` from the checkout's files, else from its git HEAD (a bare mirror has no files),
    in the first of the kind's folders that has it."""
    for d in kind.dirs:
        rel = f"{d}/{name}" if d else name
        if (src / rel).is_file():
            return (src / rel).read_text()
        try:
            return subprocess.run(["git", "-C", str(src), "show", f"HEAD:{rel}"], check=True,
                                  capture_output=True, text=True).stdout
        except (OSError, subprocess.CalledProcessError):
            continue
    raise SystemExit(f"{src}: no {name}; the directory should hold {kind.what}")


def upstream_commit(src: Path) -> str:
    """The checkout's git commit, or "?" for plain files."""
    try:
        return subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], check=True,
                              capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def measure_types(args, script, log_name: str, measure, *, probe_bytes: int = 1 << 30):
    """The driver side the model benches share: a log beside the weight files, the CPU line, a
    read probe for the bandwidth floors, then `measure(driver, args, outtype, probe)` (a list
    of result rows) for each of --types. Returns (driver, rows)."""
    from bench.common import cpu_line
    from bench.matmul import ReadProbe

    log = Path(args.data) / log_name
    log.parent.mkdir(parents=True, exist_ok=True)
    driver = Driver(args, log, Path(script))
    driver.say(f"CPU: {cpu_line()}")
    driver.say(peak_line(measure_peak(driver, args.threads or os.cpu_count())))
    probe = ReadProbe(probe_bytes, args.threads or os.cpu_count())
    rows = []
    for outtype in args.types.split(","):
        rows += measure(driver, args, outtype, probe)
    measure_peak(driver, args.threads or os.cpu_count())
    driver.say(peak_line(driver.peak))
    rate_prefills(rows, driver.peak)
    return driver, rows


PREFILL_RATE = "prefill GFLOP/s (% of peak)"


def prefill_work(rows: list[dict]) -> float | None:
    """GFLOP of the prompt's prefill, from the first row that ran our graphs. It does not depend
    on the weight type, and a peer (PyTorch, llama.cpp), which runs none of our graphs, is given
    it: the same math at the peer's speed."""
    return next((r["prefill_gflop"] for r in rows if r.get("prefill_gflop")), None)


def rate_prefills(rows: list[dict], peak: dict | None) -> None:
    """Each row's warm prefill as GFLOP/s and % of the measured peak (key PREFILL_RATE)."""
    work = prefill_work(rows)
    for r in rows:
        if r.get("prefill_ms"):
            r[PREFILL_RATE] = of_peak(r.get("prefill_gflop") or work, r["prefill_ms"] / 1e3, peak)
