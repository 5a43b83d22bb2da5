/* A measurement probe, not a store (issue 43, docs/benchmarks.md): the Redis
 * work of one CheckAndReserve of the bench's calibration case, done by a
 * native module command instead of lua/reserve.lua, to measure what leaving
 * Lua would save. It reads and writes what the script does for that case,
 * in the same formats (three level hashes with their state and lease field,
 * the record with its expiry, the ledger's hourly and daily rows), and
 * checks every bucket. It leaves out what the case does not reach:
 * idempotency, calendar windows, learned output, alerts, other
 * configurations' buckets, the state format's upgrade and the denial
 * mask. Written against redismodule.h of Redis 7.0. */
#define REDISMODULE_MAIN
#include "redismodule.h"
#include <string.h>
#include <stdint.h>

#define MAXD 64
static RedisModuleString *S_FIELD;
static double rd(const char *p) { double d; memcpy(&d, p, 8); return d; }

static void i6_unpack(const char *p, int64_t *out, int n) {
  for (int i = 0; i < n; i++) {
    int64_t v = 0; memcpy(&v, p + 6 * i, 6);
    if (v & ((int64_t)1 << 47)) v |= ~(((int64_t)1 << 48) - 1);
    out[i] = v;
  }
}
static void i6_pack(char *p, const int64_t *in, int n) {
  for (int i = 0; i < n; i++) memcpy(p + 6 * i, &in[i], 6);
}

static void ledger_row(RedisModuleCtx *ctx, RedisModuleString *kname, RedisModuleString *field,
                       const int64_t *d, long long life_ms) {
  RedisModuleKey *k = RedisModule_OpenKey(ctx, kname, REDISMODULE_READ | REDISMODULE_WRITE);
  RedisModuleString *old = NULL;
  RedisModule_HashGet(k, REDISMODULE_HASH_NONE, field, &old, NULL);
  int64_t a[10] = {0}; char buf[60];
  if (old) {
    size_t len; const char *p = RedisModule_StringPtrLen(old, &len);
    if (len == 60) i6_unpack(p, a, 10);
    RedisModule_FreeString(ctx, old);
  }
  for (int i = 0; i < 10; i++) a[i] += d[i];
  i6_pack(buf, a, 10);
  RedisModuleString *v = RedisModule_CreateString(ctx, buf, 60);
  RedisModule_HashSet(k, REDISMODULE_HASH_NONE, field, v, NULL);
  if (!old) RedisModule_SetExpire(k, life_ms);
  RedisModule_FreeString(ctx, v);
  RedisModule_CloseKey(k);
}

/* CTXB.RESERVE n key1..keyn reckey hourkey daykey hfield dfield lease spec
 * spec: doubles prompt, max_out, lease_ttl_us, then per level nb, clim, then nb x (id, limit) */
int Reserve(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
  long long n;
  if (argc < 2 || RedisModule_StringToLongLong(argv[1], &n) != REDISMODULE_OK || argc != 2 + n + 7)
    return RedisModule_WrongArity(ctx);
  size_t sl; const char *sp = RedisModule_StringPtrLen(argv[2 + n + 6], &sl);
  int ns = (int)(sl / 8); double spec[256];
  if (ns > 256) return RedisModule_ReplyWithError(ctx, "spec");
  for (int i = 0; i < ns; i++) spec[i] = rd(sp + 8 * i);
  double now = (double)RedisModule_Milliseconds() * 1000.0;
  double prompt = spec[0], max_out = spec[1], lease_ttl = spec[2];
  double cost_tokens = prompt + max_out;
  RedisModuleKey *keys[4]; double st[4][MAXD]; int sn[4]; int at[4]; int p = 3; int denied = 0;
  for (int i = 0; i < n; i++) {
    keys[i] = RedisModule_OpenKey(ctx, argv[2 + i], REDISMODULE_READ | REDISMODULE_WRITE);
    RedisModuleString *raw = NULL;
    RedisModule_HashGet(keys[i], REDISMODULE_HASH_CFIELDS, "s", &raw, NULL);
    int nb = (int)spec[p], clim = (int)spec[p + 1];
    at[i] = p;
    if (raw) {
      size_t len; const char *r = RedisModule_StringPtrLen(raw, &len);
      sn[i] = (int)(len / 8); if (sn[i] > MAXD) sn[i] = MAXD;
      for (int j = 0; j < sn[i]; j++) st[i][j] = rd(r + 8 * j);
      RedisModule_FreeString(ctx, raw);
    } else {
      sn[i] = 4; st[i][0] = 0; st[i][1] = 0; st[i][2] = 0; st[i][3] = 2;
    }
    for (int b = 0; b < nb; b++) {
      double id = spec[p + 2 + 2 * b], lim = spec[p + 3 + 2 * b];
      int k = -1;
      for (int j = 4; j + 3 < sn[i]; j += 4) if (st[i][j] == id) { k = j; break; }
      if (k < 0) { k = sn[i]; st[i][k] = id; st[i][k + 1] = lim; st[i][k + 2] = now; st[i][k + 3] = lim; sn[i] += 4; }
      double period = (double)((long long)id % 10000000);
      double dim = (double)(((long long)id % 100000000) / 10000000);
      double l = st[i][k + 1] + (now - st[i][k + 2]) * lim / (period * 1e6);
      if (l > lim) l = lim;
      double c = dim == 1 ? 1 : cost_tokens;
      if (l - c < 0) denied = 1;
      st[i][k + 1] = l - c; st[i][k + 2] = now; st[i][k + 3] = lim;
    }
    if (clim >= 0 && st[i][0] + 1 > clim) denied = 1;
    p += 2 + 2 * nb;
  }
  if (denied) {
    for (int i = 0; i < n; i++) RedisModule_CloseKey(keys[i]);
    return RedisModule_ReplyWithLongLong(ctx, 0);
  }
  double exp = now + lease_ttl; char expb[8]; memcpy(expb, &exp, 8);
  RedisModuleString *expv = RedisModule_CreateString(ctx, expb, 8);
  RedisModule_ReplyWithArray(ctx, 3 + n + 1);
  RedisModule_ReplyWithLongLong(ctx, 1);
  RedisModule_ReplyWithDouble(ctx, now);
  RedisModule_ReplyWithDouble(ctx, max_out);
  for (int i = 0; i < n; i++) {
    int clim = (int)spec[at[i] + 1];
    if (clim >= 0) { st[i][0] += 1; if (st[i][1] == 0 || exp < st[i][1]) st[i][1] = exp; }
    int grow = now + 2 * 60e6 > st[i][2];
    if (grow) st[i][2] = now + 4 * 60e6 + 1e6;
    char buf[MAXD * 8];
    memcpy(buf, st[i], sn[i] * 8);
    RedisModuleString *v = RedisModule_CreateString(ctx, buf, sn[i] * 8);
    if (clim >= 0)
      RedisModule_HashSet(keys[i], REDISMODULE_HASH_NONE, S_FIELD, v, argv[2 + n + 5], expv, NULL);
    else
      RedisModule_HashSet(keys[i], REDISMODULE_HASH_CFIELDS, "s", v, NULL);
    if (grow) RedisModule_SetExpire(keys[i], (long long)((st[i][2] - now) / 1000));
    RedisModule_ReplyWithString(ctx, v);
    RedisModule_FreeString(ctx, v);
    RedisModule_CloseKey(keys[i]);
  }
  /* the record */
  char rec[1 + 8 * 2 + 25 + 8 * 4]; rec[0] = 'R';
  double cost = prompt + max_out; memcpy(rec + 1, &cost, 8); memcpy(rec + 9, &exp, 8);
  memset(rec + 17, 0, 25); double tail[4] = {0, max_out, 0, now}; memcpy(rec + 42, tail, 32);
  RedisModuleKey *rk = RedisModule_OpenKey(ctx, argv[2 + n], REDISMODULE_WRITE);
  RedisModuleString *rv = RedisModule_CreateString(ctx, rec, sizeof rec);
  RedisModule_StringSet(rk, rv);
  RedisModule_SetExpire(rk, 600000);
  RedisModule_FreeString(ctx, rv);
  RedisModule_CloseKey(rk);
  /* the ledger's two rows */
  int64_t d[10] = {0, 0, 1, (int64_t)cost, 0, 0, 0, 0, 0, 0};
  ledger_row(ctx, argv[2 + n + 1], argv[2 + n + 3], d, 3600000);
  ledger_row(ctx, argv[2 + n + 2], argv[2 + n + 4], d, 86400000);
  RedisModule_ReplyWithDouble(ctx, max_out);
  RedisModule_FreeString(ctx, expv);
  return REDISMODULE_OK;
}

int RedisModule_OnLoad(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
  (void)argv; (void)argc;
  if (RedisModule_Init(ctx, "ctxbprobe", 1, REDISMODULE_APIVER_1) == REDISMODULE_ERR) return REDISMODULE_ERR;
  S_FIELD = RedisModule_CreateString(NULL, "s", 1);
  if (RedisModule_CreateCommand(ctx, "ctxb.reserve", Reserve, "write deny-oom", 2, -1, 1) == REDISMODULE_ERR)
    return REDISMODULE_ERR;
  return REDISMODULE_OK;
}
