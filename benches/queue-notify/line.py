"""What a wait costs Redis: lua/line.lua's CPU per operation (Redis
commandstats), with a line of WAITING tickets of three tenants — join,
standing (is it my turn?), leave granted, and wake (a Commit's or a
heartbeat's) — each phase measured alone. Usage: line.py PORT LINE_LUA
[CALLS] [WAITING]."""
import sys
import redis

port, path = int(sys.argv[1]), sys.argv[2]
calls = int(sys.argv[3]) if len(sys.argv) > 3 else 5000
waiting = int(sys.argv[4]) if len(sys.argv) > 4 else 48
r = redis.Redis(port=port)
sha = r.script_load(open(path).read())
keys = ["ctxb:{q:}:v", "ctxb:{q:}:0", "ctxb:{q:}:1", "ctxb:{q:}:2", "ctxb:{q:}:p"]


def op(code, ticket="", tenant="", weight=1, cost=0, wait_us=0, most=0):
    return r.evalsha(sha, len(keys), *keys, code, "r1", ticket, 1, tenant, weight, cost, wait_us, most,
                     "ctxb:q:wake", "")


def join(i):
    reply = op(1, tenant="t%d" % (i % 3), weight=1 + (i % 3 == 2), cost=1000, wait_us=60_000_000, most=100000)
    return reply[1].decode()


def usec(fn, n):
    r.config_resetstat()
    for i in range(n):
        fn(i)
    stats = r.info("commandstats")["cmdstat_evalsha"]
    return stats["usec"] / stats["calls"]


tickets = [join(i) for i in range(waiting)]
print(f"line of {waiting} tickets, {calls} calls a phase; Redis µs per line.lua call:")
print(f"  join      {usec(lambda i: tickets.append(join(i)), calls):6.2f}")
# Back to WAITING tickets, oldest first served.
head = lambda: op(5)[0].decode()
while r.zcard(keys[2]) + r.zcard(keys[4]) > waiting:
    op(3, ticket=head())
print(f"  standing  {usec(lambda i: op(2, ticket=head()), calls):6.2f}   (a wake (5) then a standing (2) per call)")
print(f"  wake      {usec(lambda i: op(5), calls):6.2f}")


def serve(i):
    op(3, ticket=op(5)[0].decode())
    join(i)


print(f"  grant     {usec(serve, calls):6.2f}   (wake + leave granted + join: the line stays full)")
