"""The fixed cost of an EVALSHA: 1,000 calls of `return 1` bare, then 1,000
with KEYS and ARGV of a reserve's shape and sizes (4 keys, 13 arguments,
about 1,100 bytes). An INFO after each lets callgrind cut a dump.

usage: eval_floor.py PORT"""
import os
import sys

import redis

port = int(sys.argv[1])
r = redis.Redis(port=port)
sha = r.script_load("return 1")
keys = ['ctxb:g', 'ctxb:{t:tenant-1}t', 'ctxb:{t:tenant-1}u:dXNlci0x', 'ctxb:{t:tenant-1}r:' + 'A'*22]
args = [os.urandom(8*40), b'#' + b'B'*22, b'600000', b'0', os.urandom(57), b'<' + b'd'*40, b'<' + b'd'*20, b'<' + b'd'*20, b'<' + b'd'*16, b'ctxb:{t:tenant-1}L:', b'g', b'g:dXNlci0x', b'ctxb:{t:tenant-1}r:']
for label, k, a in (('bare', [], []), ('reserve-shaped', keys, args)):
    p = r.pipeline(transaction=False)
    for i in range(1000):
        p.evalsha(sha, len(k), *k, *a)
    p.execute(); r.info('cpu')
print('done')
