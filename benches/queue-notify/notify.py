"""How a replica should learn that its waiting call may go (issue 45):
what each way of telling costs Redis, and how soon it arrives.

1. Redis CPU per call (INFO commandstats, usec_per_call) of a grant-shaped
   script — take a queue's head ticket (ZRANGE, ZREM), write the level
   (HSET) — bare, with a PUBLISH of the next head to 0, 1 and 4
   subscribers; and of a reserve-shaped write (HSET of 6 keys) alone,
   after a ZCARD of an empty queue (what a reserve pays to keep from
   passing waiting calls while none wait), and with keyspace notifications
   on (`notify-keyspace-events Kh`), which Redis then sends for every write
   of every key, queued or not.
2. Delivery: the time from a PUBLISH inside the script to a subscriber's
   receipt (redis-py, a thread per subscriber), p50 / p99 / max.

usage: notify.py PORT [CALLS]"""
import statistics
import sys
import threading
import time

import redis

port = int(sys.argv[1])
calls = int(sys.argv[2]) if len(sys.argv) > 2 else 20000
r = redis.Redis(port=port)

GRANT = """
local head = redis.call('ZRANGE', KEYS[1], 0, 0)
if head[1] then redis.call('ZREM', KEYS[1], head[1]) end
redis.call('HSET', KEYS[2], 'n', ARGV[1])
local next_head = redis.call('ZRANGE', KEYS[1], 0, 0)
if ARGV[2] == '1' then
  redis.call('PUBLISH', KEYS[3], (next_head[1] or '') .. ' ' .. ARGV[3])
end
return 1
"""
WRITES = """
for i = 1, #KEYS do redis.call('HSET', KEYS[i], 'n', ARGV[1]) end
return 1
"""
# The same writes after looking at an (empty) queue first: what a reserve
# that must not pass waiting calls pays while nothing waits.
GATED = """
if redis.call('ZCARD', ARGV[2]) > 0 then return 0 end
for i = 1, #KEYS do redis.call('HSET', KEYS[i], 'n', ARGV[1]) end
return 1
"""
grant = r.script_load(GRANT)
writes = r.script_load(WRITES)
gated = r.script_load(GATED)
QUEUE, LEVEL, CHANNEL = 'ctxb:q:{g}', 'ctxb:{g}g', 'ctxb:q:{g}:wake'


def usec_per_call():
    return r.info('commandstats')['cmdstat_evalsha']['usec_per_call']


def measure(label, sha, keys, args, n):
    r.config_resetstat()
    p = r.pipeline(transaction=False)
    for i in range(n):
        if i % 100 == 0:
            # Keep the queue non-empty: each grant takes one ticket.
            p.zadd(QUEUE, {f't{j}': j for j in range(i, i + 100)})
        p.evalsha(sha, len(keys), *keys, *args)
        if len(p) >= 1000:
            p.execute()
    p.execute()
    print(f'{label:<52} {usec_per_call():6.2f} us/call')


class Subscriber(threading.Thread):
    """Receives the channel's messages; each carries its send time."""

    def __init__(self):
        super().__init__(daemon=True)
        self.delays = []
        self.pubsub = redis.Redis(port=port).pubsub(ignore_subscribe_messages=True)
        self.pubsub.subscribe(CHANNEL)
        self.ready = threading.Event()

    def run(self):
        self.ready.set()
        for m in self.pubsub.listen():
            if m['data'] == b'stop':
                return
            sent = float(m['data'].split(b' ')[1])
            self.delays.append(time.perf_counter() - sent)


def with_subscribers(n):
    subs = [Subscriber() for _ in range(n)]
    for s in subs:
        s.start()
        s.ready.wait()
    while r.pubsub_numsub(CHANNEL)[0][1] < n:
        time.sleep(0.01)
    return subs


def stop(subs):
    r.publish(CHANNEL, 'stop')
    for s in subs:
        s.join(timeout=5)


print(f'== Redis CPU per call, {calls} calls each (INFO commandstats)')
measure('grant, no PUBLISH', grant, [QUEUE, LEVEL, CHANNEL], [1, 0, 0], calls)
for n in (0, 1, 4):
    subs = with_subscribers(n)
    measure(f'grant + PUBLISH to {n} subscriber(s)', grant, [QUEUE, LEVEL, CHANNEL],
            [1, 1, '0.0'], calls)
    stop(subs)
six = [f'ctxb:{{t:a}}k{i}' for i in range(6)]
r.config_set('notify-keyspace-events', '')
measure('6 writes, keyspace notifications off', writes, six, [1], calls)
measure('6 writes after an empty queue\'s ZCARD', gated, six, [1, 'ctxb:q:{t:a}none'], calls)
r.config_set('notify-keyspace-events', 'Kh')
subs = []
ks = redis.Redis(port=port).pubsub()
ks.psubscribe('__keyspace@0__:*')
measure('6 writes, keyspace notifications on (1 listener)', writes, six, [1], calls)
ks.close()
r.config_set('notify-keyspace-events', '')

print('== delivery: PUBLISH inside the script to a subscriber, one grant every 1 ms')
subs = with_subscribers(1)
for i in range(2000):
    r.zadd(QUEUE, {f'd{i}': i})
    r.evalsha(grant, 3, QUEUE, LEVEL, CHANNEL, 1, 1, repr(time.perf_counter()))
    time.sleep(0.001)
time.sleep(0.2)
stop(subs)
d = sorted(x * 1e6 for x in subs[0].delays)
print(f'{len(d)} received: p50 {statistics.median(d):.0f} us, '
      f'p99 {d[int(len(d) * 0.99) - 1]:.0f} us, max {d[-1]:.0f} us')
