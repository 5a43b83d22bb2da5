// The client against the real service, on the memory store and on Redis:
// every RPC, typed errors, denials as answers, and withReservation's
// settlements.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import {
  BudgetClient, BudgetDenied, BudgetError, BudgetInvalidArgument, BudgetNotFound,
  BudgetPermissionDenied, BudgetUnavailable,
} from "../dist/index.js";
import { BOUND, TOKEN, freePort, startRedis, startService } from "./service.mjs";

const ask = (userId, extra = {}) => ({ tenantId: "acme", userId, tier: "free", model: "gpt-4o-mini", promptTokens: 20, maxOutputTokens: 10, ...extra });

for (const store of ["memory", "redis"]) {
  describe(`on the ${store} store`, () => {
    let service, redis, client;
    before(async () => {
      redis = store === "redis" ? await startRedis() : undefined;
      service = await startService(undefined, redis?.url);
      client = new BudgetClient({ baseUrl: service.baseUrl, token: TOKEN });
    });
    after(async () => {
      await service.stop();
      redis?.stop();
    });

    const userTokensLeft = async (userId) => {
      const s = await client.getStatus({ tenantId: "acme", userId, tier: "free" });
      return s.limits.find((l) => l.level === "LEVEL_USER" && l.dimension === "DIMENSION_TOKENS").remaining;
    };

    test("every RPC, with counts as numbers both ways", async () => {
      const r = await client.checkAndReserve(ask("rpc", { promptTokens: 20n, maxOutputTokens: "10" }));
      assert.equal(r.allowed, true);
      assert.equal(typeof r.reservedTokens, "number");
      assert.equal(r.reservedTokens, 30);
      assert.equal(r.grantedMaxOutputTokens, 10);
      assert.ok(r.limits.every((l) => typeof l.remaining === "number"));
      const renewed = await client.renewLease({ reservationId: r.reservationId, leaseTtlMs: 60000 });
      assert.equal(renewed.outcome, "OUTCOME_APPLIED");
      assert.equal(typeof renewed.expiresInMs, "number");
      const c = await client.commit({ reservationId: r.reservationId, promptTokens: 20, completionTokens: 4 });
      assert.equal(c.outcome, "OUTCOME_APPLIED");
      assert.equal(c.tokenDelta, -6);
      const again = await client.refund({ reservationId: r.reservationId });
      assert.equal(again.outcome, "OUTCOME_ALREADY_SETTLED");
      assert.equal(await userTokensLeft("rpc"), 100000 - 24);
      const e = await client.getEstimator({ model: "gpt-4o-mini" });
      assert.ok(Array.isArray(e.keys));
    });

    test("a denial is an answer with its reason, level and retry", async () => {
      // A refund gives the request back: these commit.
      for (let i = 0; i < 3; i++) {
        const r = await client.checkAndReserve(ask("denied"));
        await client.commit({ reservationId: r.reservationId, promptTokens: 20, completionTokens: 1 });
      }
      const d = await client.checkAndReserve(ask("denied"));
      assert.equal(d.allowed, false);
      assert.equal(d.reason, "REASON_RPM_EXCEEDED");
      assert.equal(d.limitingLevel, "LEVEL_USER");
      assert.ok(d.retryAfterMs > 0 && typeof d.retryAfterMs === "number");
    });

    test("typed errors: a bad tier, a reservation gone, a tenant binding", async () => {
      await assert.rejects(client.checkAndReserve(ask("e", { tier: "no-such-tier" })), (e) => {
        assert.ok(e instanceof BudgetInvalidArgument && e instanceof BudgetError);
        assert.equal(e.code, "INVALID_ARGUMENT");
        assert.match(e.details, /unknown tier/);
        return true;
      });
      await assert.rejects(client.commit({ reservationId: "rsv_forged", promptTokens: 1 }), BudgetInvalidArgument);
      // A reservation whose record expired (a 200 ms lease, kept 1 s after).
      const r = await client.checkAndReserve(ask("gone", { leaseTtlMs: 200 }));
      await new Promise((ok) => setTimeout(ok, 1800));
      await assert.rejects(client.renewLease({ reservationId: r.reservationId }), (e) => {
        assert.ok(e instanceof BudgetNotFound, `${e}`);
        assert.equal(e.code, "NOT_FOUND");
        return true;
      });
      const bound = new BudgetClient({ baseUrl: service.baseUrl, token: BOUND });
      await assert.rejects(bound.checkAndReserve({ ...ask("x"), tenantId: "globex" }), (e) => {
        assert.ok(e instanceof BudgetPermissionDenied);
        assert.equal(e.code, "PERMISSION_DENIED");
        return true;
      });
      const anonymous = new BudgetClient({ baseUrl: service.baseUrl });
      await assert.rejects(anonymous.getStatus({ tenantId: "acme", tier: "free" }), BudgetPermissionDenied);
    });

    test("withReservation commits the usage set", async () => {
      const before = await userTokensLeft("usage");
      const out = await client.withReservation(ask("usage"), async (grant) => {
        assert.equal(grant.allowed, true);
        grant.setUsage({ promptTokens: 18, completionTokens: 7 });
        return "answer";
      });
      assert.equal(out, "answer");
      assert.equal(before - (await userTokensLeft("usage")), 25);
    });

    test("withReservation commits the prompt as reserved and the output recorded", async () => {
      const before = await userTokensLeft("output");
      await client.withReservation(ask("output"), (grant) => {
        grant.recordOutput("Hello");
        grant.recordOutput(" world");
      });
      const spent = before - (await userTokensLeft("output"));
      assert.ok(spent > 20 && spent < 30, `the prompt (20) and two words: ${spent}`);
    });

    test("withReservation refunds when nothing was recorded, or the callback threw", async () => {
      const before = await userTokensLeft("refund");
      await client.withReservation(ask("refund"), () => undefined);
      await assert.rejects(client.withReservation(ask("refund"), () => { throw new Error("upstream 500"); }), /upstream 500/);
      assert.equal(await userTokensLeft("refund"), before);
      // A throw after output reached the caller pays for what was delivered.
      await assert.rejects(client.withReservation(ask("refund"), (grant) => {
        grant.recordOutput("partial answer");
        throw new Error("stream broke");
      }), /stream broke/);
      assert.ok(before - (await userTokensLeft("refund")) > 20);
    });

    test("withReservation throws BudgetDenied on a denial, with the decision", async () => {
      const used = (grant) => grant.setUsage({ promptTokens: 20, completionTokens: 1 });
      for (let i = 0; i < 3; i++) await client.withReservation(ask("deny"), used);
      await assert.rejects(client.withReservation(ask("deny"), () => assert.fail("not called")), (e) => {
        assert.ok(e instanceof BudgetDenied);
        assert.equal(e.reason, "REASON_RPM_EXCEEDED");
        assert.equal(e.level, "LEVEL_USER");
        assert.ok(e.retryAfterMs > 0);
        assert.equal(e.decision.allowed, false);
        return true;
      });
    });

    test("an aborted call rejects with the signal's reason and an abort mid-call refunds", async () => {
      const controller = new AbortController();
      controller.abort(new Error("the user left"));
      await assert.rejects(client.checkAndReserve(ask("abort"), { signal: controller.signal }), /the user left/);
      const before = await userTokensLeft("abort");
      const call = new AbortController();
      await assert.rejects(client.withReservation(ask("abort"), async () => {
        call.abort(new Error("client went away"));
        throw call.signal.reason;
      }, { signal: call.signal }), /client went away/);
      assert.equal(await userTokensLeft("abort"), before, "refunded");
      const s = await client.getStatus({ tenantId: "acme", userId: "abort", tier: "free" });
      assert.equal(s.leases.filter((l) => l.level === "LEVEL_USER").reduce((n, l) => n + l.active, 0), 0);
    });
  });
}

test("the service down is BudgetUnavailable; opted-in retries are for reads and idempotent reservations only", async () => {
  const port = await freePort();
  const down = new BudgetClient({ baseUrl: `http://127.0.0.1:${port}`, token: TOKEN, timeoutMs: 1000 });
  await assert.rejects(down.getStatus({ tenantId: "acme", tier: "free" }), (e) => {
    assert.ok(e instanceof BudgetUnavailable);
    assert.equal(e.code, "UNAVAILABLE");
    return true;
  });
  // A reservation without an idempotency key is never retried.
  let calls = 0;
  const counting = (url, init) => { calls++; return fetch(url, init); };
  const retrying = new BudgetClient({ baseUrl: `http://127.0.0.1:${port}`, token: TOKEN, fetch: counting, retry: { attempts: 3, backoffMs: 10 } });
  await assert.rejects(retrying.checkAndReserve(ask("r")), BudgetUnavailable);
  assert.equal(calls, 1);
  await assert.rejects(retrying.checkAndReserve(ask("r", { idempotencyKey: "k-1" })), BudgetUnavailable);
  assert.equal(calls, 4, "an idempotent reservation is retried");
  await assert.rejects(retrying.getStatus({ tenantId: "acme", tier: "free" }), BudgetUnavailable);
  assert.equal(calls, 7, "reads are retried");
});

test("bad options are refused at construction", () => {
  assert.throws(() => new BudgetClient({ baseUrl: "localhost:8080" }), /baseUrl/);
  assert.throws(() => new BudgetClient({ baseUrl: "http://x", timeoutMs: 0 }), /timeoutMs/);
  assert.throws(() => new BudgetClient({ baseUrl: "http://x", retry: { attempts: 0, backoffMs: 1 } }), /retry/);
});
