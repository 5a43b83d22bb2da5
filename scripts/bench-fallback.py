"""What a fallback costs Redis (docs/benchmarks.md, "Fallback candidates"):
a `ctxbudget serve` on a fresh redis-server, N CheckAndReserve + Refund on
one model, then N with candidate_models [a, b, c] whose first two are spent;
EVALSHA calls and Redis time per decision from INFO commandstats.

    target/venv/bin/python scripts/bench-fallback.py [N] [REDIS_PORT]   # default 3000; needs a release build
                                     # (CTXBUDGET_BIN: another binary)

With REDIS_PORT, a redis-server already listening there is used (e.g. one
under callgrind with --dump-before=infoCommand: each phase is then one dump).
"""
import os, re, socket, subprocess, sys, time
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "clients/python/src"))
from ctxbudget import BudgetClient
def port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p
sp = port()
if len(sys.argv) > 2:
    rp, redis = int(sys.argv[2]), None
else:
    rp = port()
    redis = subprocess.Popen(["redis-server", "--port", str(rp), "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
    time.sleep(0.5)
srv = subprocess.Popen([os.environ.get("CTXBUDGET_BIN", os.path.join(REPO, "target/release/ctxbudget")), "serve", "--config", os.path.join(REPO, "config/bench-fallback.toml"),
                        "--listen", f"127.0.0.1:{sp}", "--redis-url", f"redis://127.0.0.1:{rp}/0"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
time.sleep(2)
def stats():
    out = subprocess.run(["redis-cli", "-p", str(rp), "info", "commandstats"], capture_output=True, text=True).stdout
    m = re.search(r"cmdstat_evalsha:calls=(\d+),usec=(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)
N = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
with BudgetClient(f"127.0.0.1:{sp}") as c:
    base = dict(tenant="acme", user="u1", tier="t", prompt_tokens=500, max_output_tokens=500)
    for m in ["a-1", "b-1"]:
        c.check_and_reserve(model=m, **base)  # spend a and b
    for label, kw in [("plain c-1", dict(model="c-1")), ("fallback a,b,c", dict(candidate_models=["a-1", "b-1", "c-1"]))]:
        for _ in range(200):
            r = c.check_and_reserve(**base, **kw); c.refund(r.reservation_id)
        c0, u0 = stats()
        for _ in range(N):
            r = c.check_and_reserve(**base, **kw)
            assert r.allowed, r
            c.refund(r.reservation_id)
        c1, u1 = stats()
        calls, usec = c1 - c0, u1 - u0
        print(f"{label}: {calls / N:.1f} EVALSHA per decision + refund, {usec / N:.1f} µs of Redis per decision + refund")
srv.terminate()
if redis:
    redis.terminate()
