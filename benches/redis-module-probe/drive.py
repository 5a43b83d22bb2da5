"""Drives the probe like the bench's calibration: 1,000 reservations per
round over 100 users of 10 tenants, 3 levels with 7 buckets and 3
concurrency limits; with SETTLE set, every lease is freed after its reserve
(as a Commit would), so the level hashes stay small. An INFO after each
round lets callgrind cut a dump per round.

usage: drive.py PORT ROUNDS"""
import base64
import os
import random
import struct
import sys

import redis

port = int(sys.argv[1])
rounds = int(sys.argv[2])
r = redis.Redis(port=port)
def spec():
    d = [500.0, 200.0, 5e6]
    d += [2, 50000, 1*1e7+60, 2e6, 2*1e7+60, 2e10]          # global
    d += [3, 20000, 1*1e7+60, 3e5, 1*1e7+86400, 1e8, 2*1e7+60, 2e9]  # tenant
    d += [2, 1000, 1*1e7+60, 3e4, 2*1e7+60, 2e8]             # user
    return struct.pack('<%dd' % len(d), *d)
S = spec()
def b64(n): return base64.urlsafe_b64encode(os.urandom(n)).rstrip(b'=')
p = r.pipeline(transaction=False)
for rnd in range(rounds):
    for i in range(1000):
        un = random.randrange(100); t = 'tenant-%d' % (un % 10); u = base64.urlsafe_b64encode(b'user-%d' % un).rstrip(b'=').decode()
        tag = '{t:%s}' % t; nonce = b64(16)
        p.execute_command('CTXB.RESERVE', 3, 'ctxb:g', 'ctxb:%st' % tag, 'ctxb:%su:%s' % (tag, u),
            'ctxb:%sr:%s' % (tag, nonce.decode()), 'ctxb:%sL:h:493911' % tag, 'ctxb:%sL:d:20579' % tag,
            'g', 'g:%s' % u, b'#' + nonce, S)
        if os.environ.get('SETTLE'):
            for k in ('ctxb:g', 'ctxb:%st' % tag, 'ctxb:%su:%s' % (tag, u)):
                p.hdel(k, b'#' + nonce)
        if i % 50 == 49: p.execute()
    p.execute()
    r.info('cpu')
print('done')
