"""What scripts/pg-attacks.py and scripts/ingest-attacks.py share: a server started on a
fresh directory, its RSS sampled from /proc while each attack runs for a time in threads of
its own beside a probe, and one line of results per attack. Stdlib only; loopback only."""

import socket
import subprocess
import threading
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def start_server(binary, config, http_port):
    """`tidemark serve --config CONFIG`, once its HTTP port answers /ready."""
    server = subprocess.Popen(
        [binary, "serve", "--config", config],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{http_port}/ready", timeout=1)
            break
        except OSError:
            time.sleep(0.1)
    return server


def stop_server(server, grace=600):
    """SIGTERM, then wait for the graceful stop (it flushes what the attacks left in memory)
    and say how long it took; killed if it takes longer than `grace` seconds."""
    started = time.monotonic()
    server.terminate()
    try:
        server.wait(timeout=grace)
        print(f"graceful stop took {time.monotonic() - started:.0f} s")
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
        print(f"graceful stop took over {grace} s: killed")


def run_attacks(server, attacks, probe, target, seconds):
    """Runs each of `attacks` ({name: (function, threads)}: `function(target, stop, answers)`
    in each thread) for `seconds` beside `probe(target, stop, results)`, and prints the peak
    RSS, the attack's answers (when it counts them) and the probe's results."""
    print(f"idle RSS {rss_kib(server.pid) / 1024:.0f} MiB")
    for name, (attack, threads) in attacks.items():
        stop = threading.Event()
        answers = {"lock": threading.Lock()}
        results = {"ok": 0, "failed": 0, "slowest": 0.0, "last_error": ""}
        workers = [
            threading.Thread(target=attack, args=(target, stop, answers), daemon=True)
            for _ in range(threads)
        ]
        workers.append(threading.Thread(target=probe, args=(target, stop, results), daemon=True))
        for w in workers:
            w.start()
        peak = 0
        ends = time.monotonic() + seconds
        while time.monotonic() < ends and server.poll() is None:
            peak = max(peak, rss_kib(server.pid))
            time.sleep(0.2)
        stop.set()
        for w in workers:
            w.join(timeout=70)
        alive = "alive" if server.poll() is None else f"EXITED {server.returncode}"
        counted = {k: v for k, v in answers.items() if k != "lock"}
        answered = (
            "  answers {" + ", ".join(f"{k}: {v}" for k, v in sorted(counted.items(), key=str)) + "}"
            if counted
            else ""
        )
        print(
            f"{name:36} peak RSS {peak / 1024:6.0f} MiB{answered}  probe ok {results['ok']}, "
            f"failed {results['failed']}, slowest {results['slowest'] * 1000:.0f} ms  "
            f"server {alive} {results['last_error']}"
        )
        if server.poll() is not None:
            break
        time.sleep(2)


def count(answers, what):
    """Counts one answer of an attack's requests (a status, say)."""
    with answers["lock"]:
        answers[what] = answers.get(what, 0) + 1
