// The AI SDK middleware with the SDK's own mock language models, for `ai` 7
// (models v4) and `ai` 6 (models v3, installed as `ai6`), against the real
// service: generate and stream commit the usage the provider reports; a
// stream aborted mid-way commits the prompt and the text delivered; a
// provider error refunds; a concurrency of 2 admits 2 of 5 parallel calls;
// the output is capped at the grant; a denial throws BudgetDenied.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import * as ai7 from "ai";
import * as test7 from "ai/test";
import * as ai6 from "ai6";
import * as test6 from "ai6/test";
import { BudgetClient, BudgetDenied, BudgetUnavailable, budgetMiddleware } from "../dist/index.js";
import { TOKEN, startService } from "./service.mjs";

const CONFIG = `
[[auth.tokens]]
name = "app"
token = "${TOKEN}"

[tiers.app]
max_context_tokens = 8000
default_max_output_tokens = 50
user = { requests = [{ limit = 1000, period = "1h" }], tokens = [{ limit = 100000, period = "1d" }], concurrency = 2 }
`;

const usage = (input, output) => ({
  inputTokens: { total: input, noCache: input, cacheRead: 0, cacheWrite: undefined },
  outputTokens: { total: output, text: output, reasoning: undefined },
});
const finish = { unified: "stop", raw: "stop" };
const sleep = (ms) => new Promise((ok) => setTimeout(ok, ms));

const SDKS = [
  { name: "ai 7", sdk: ai7, Mock: test7.MockLanguageModelV4, streamOf: test7.convertArrayToReadableStream },
  { name: "ai 6", sdk: ai6, Mock: test6.MockLanguageModelV3, streamOf: test6.convertArrayToReadableStream },
];

describe("budgetMiddleware", () => {
  let service, client;
  before(async () => {
    service = await startService(CONFIG);
    client = new BudgetClient({ baseUrl: service.baseUrl, token: TOKEN });
  });
  after(() => service.stop());

  const status = async (user) => {
    const s = await client.getStatus({ tenantId: "acme", userId: user, tier: "app" });
    const tokens = s.limits.find((l) => l.level === "LEVEL_USER" && l.dimension === "DIMENSION_TOKENS").remaining;
    const held = s.leases.filter((l) => l.level === "LEVEL_USER").reduce((n, l) => n + l.active, 0);
    return { spent: 100000 - tokens, held };
  };

  for (const { name, sdk, Mock, streamOf } of SDKS) {
    describe(name, () => {
      const wrapped = (model, user) =>
        sdk.wrapLanguageModel({ model, middleware: budgetMiddleware({ client, tenant: "acme", user, tier: "app" }) });

      test("generate: reserved, capped at the grant, committed at the usage reported", async () => {
        const user = `${name}-generate`;
        const seen = [];
        const model = new Mock({
          modelId: "gpt-4o-mini",
          doGenerate: async (options) => {
            seen.push(options.maxOutputTokens);
            return { content: [{ type: "text", text: "Budgets keep calls honest." }], finishReason: finish, usage: usage(12, 5), warnings: [] };
          },
        });
        const r = await sdk.generateText({ model: wrapped(model, user), prompt: "Say something about budgets.", maxRetries: 0 });
        assert.equal(r.text, "Budgets keep calls honest.");
        await sdk.generateText({ model: wrapped(model, user), prompt: "Again, briefly.", maxOutputTokens: 20, maxRetries: 0 });
        assert.deepEqual(seen, [50, 20], "the grant (the tier's default) when the caller gave none, else the smaller");
        assert.deepEqual(await status(user), { spent: 2 * 17, held: 0 });
      });

      test("a user named per call, and providerOptions.ctxbudget overriding it", async () => {
        const model = new Mock({
          modelId: "gpt-4o-mini",
          doGenerate: async () => ({ content: [{ type: "text", text: "ok" }], finishReason: finish, usage: usage(3, 1), warnings: [] }),
        });
        const perCall = sdk.wrapLanguageModel({
          model,
          middleware: budgetMiddleware({ client, tenant: "acme", tier: "app", user: (o) => String(o.providerOptions?.app?.user) }),
        });
        await sdk.generateText({ model: perCall, prompt: "hi", maxRetries: 0, providerOptions: { app: { user: `${name}-per-call` } } });
        await sdk.generateText({ model: perCall, prompt: "hi", maxRetries: 0, providerOptions: { app: { user: "x" }, ctxbudget: { user: `${name}-override` } } });
        assert.equal((await status(`${name}-per-call`)).spent, 4);
        assert.equal((await status(`${name}-override`)).spent, 4);
      });

      test("stream: committed at the usage of its finish part", async () => {
        const user = `${name}-stream`;
        const model = new Mock({
          modelId: "gpt-4o-mini",
          doStream: async () => ({
            stream: streamOf([
              { type: "stream-start", warnings: [] },
              { type: "text-start", id: "t" },
              { type: "text-delta", id: "t", delta: "Hello" },
              { type: "text-delta", id: "t", delta: ", budgets" },
              { type: "text-end", id: "t" },
              { type: "finish", finishReason: finish, usage: usage(9, 4) },
            ]),
          }),
        });
        const r = sdk.streamText({ model: wrapped(model, user), prompt: "Stream a greeting.", maxRetries: 0 });
        assert.equal(await r.text, "Hello, budgets");
        for (let i = 0; i < 50 && (await status(user)).held; i++) await sleep(20);
        assert.deepEqual(await status(user), { spent: 13, held: 0 });
      });

      test("a stream that ends without usage commits the prompt and the text delivered", async () => {
        const user = `${name}-no-usage`;
        const none = { inputTokens: { total: undefined }, outputTokens: { total: undefined } };
        const model = new Mock({
          modelId: "gpt-4o-mini",
          doStream: async () => ({
            stream: streamOf([
              { type: "stream-start", warnings: [] },
              { type: "text-start", id: "t" },
              { type: "text-delta", id: "t", delta: "An answer from a provider that reports no usage at all" },
              { type: "text-end", id: "t" },
              { type: "finish", finishReason: finish, usage: none },
            ]),
          }),
        });
        const r = sdk.streamText({ model: wrapped(model, user), prompt: "Answer without usage.", maxRetries: 0 });
        assert.match(await r.text, /no usage/);
        for (let i = 0; i < 50 && (await status(user)).held; i++) await sleep(20);
        const s = await status(user);
        assert.equal(s.held, 0);
        assert.ok(s.spent > 10 && s.spent < 50, `the prompt and the words delivered, not the grant of 50: ${s.spent}`);
      });

      test("a stream aborted mid-way commits the prompt and the text delivered", async () => {
        const user = `${name}-aborted`;
        const controller = new AbortController();
        const model = new Mock({
          modelId: "gpt-4o-mini",
          doStream: async ({ abortSignal }) => ({
            stream: new ReadableStream({
              async start(c) {
                c.enqueue({ type: "stream-start", warnings: [] });
                c.enqueue({ type: "text-start", id: "t" });
                c.enqueue({ type: "text-delta", id: "t", delta: "The first part of a long answer" });
                await new Promise((ok) => abortSignal?.addEventListener("abort", ok, { once: true }));
                c.error(abortSignal?.reason ?? new Error("aborted"));
              },
            }),
          }),
        });
        const r = sdk.streamText({ model: wrapped(model, user), prompt: "Tell me a long story.", abortSignal: controller.signal, maxRetries: 0 });
        for await (const chunk of r.textStream) {
          assert.match(chunk, /first part/);
          controller.abort();
          break;
        }
        for (let i = 0; i < 100 && (await status(user)).held; i++) await sleep(20);
        const s = await status(user);
        assert.equal(s.held, 0, "its slot is free");
        assert.ok(s.spent > 6 && s.spent < 50, `the prompt and seven words, not the grant: ${s.spent}`);
      });

      test("ctxbudget unreachable: denied by default, or called unbudgeted with onUnavailable: allow", async () => {
        const down = new BudgetClient({ baseUrl: "http://127.0.0.1:9", timeoutMs: 500 });
        let called = 0;
        const model = new Mock({
          modelId: "gpt-4o-mini",
          doGenerate: async (options) => {
            called++;
            assert.equal(options.maxOutputTokens, 30, "the caller's own cap, untouched");
            return { content: [{ type: "text", text: "ok" }], finishReason: finish, usage: usage(3, 1), warnings: [] };
          },
        });
        const wrap = (onUnavailable) =>
          sdk.wrapLanguageModel({ model, middleware: budgetMiddleware({ client: down, tenant: "acme", user: "u", tier: "app", onUnavailable }) });
        await assert.rejects(sdk.generateText({ model: wrap(undefined), prompt: "hi", maxOutputTokens: 30, maxRetries: 0 }), BudgetUnavailable);
        assert.equal(called, 0, "the provider is not called");
        const r = await sdk.generateText({ model: wrap("allow"), prompt: "hi", maxOutputTokens: 30, maxRetries: 0 });
        assert.equal(r.text, "ok");
        assert.equal(called, 1);
        assert.throws(() => budgetMiddleware({ client: down, tenant: "a", user: "u", tier: "t", onUnavailable: "maybe" }), /onUnavailable/);
      });

      test("a provider error refunds", async () => {
        const user = `${name}-error`;
        const model = new Mock({ modelId: "gpt-4o-mini", doGenerate: async () => { throw new Error("upstream 500"); } });
        await assert.rejects(sdk.generateText({ model: wrapped(model, user), prompt: "fail", maxRetries: 0 }), /upstream 500/);
        assert.deepEqual(await status(user), { spent: 0, held: 0 });
      });

      test("a concurrency of 2 admits 2 of 5 parallel calls; the others are BudgetDenied", async () => {
        const user = `${name}-parallel`;
        // The admitted calls hold their slots until the other three were refused
        // (however slow the machine), then finish.
        let release;
        const refusedAll = new Promise((ok) => { release = ok; });
        const model = new Mock({
          modelId: "gpt-4o-mini",
          doGenerate: async () => {
            await refusedAll;
            return { content: [{ type: "text", text: "slow" }], finishReason: finish, usage: usage(4, 1), warnings: [] };
          },
        });
        const started = Array.from({ length: 5 }, () => sdk.generateText({ model: wrapped(model, user), prompt: "slow", maxRetries: 0 }));
        let refused = 0;
        for (const call of started) call.catch(() => { if (++refused === 3) release(); });
        const safety = setTimeout(release, 15000);
        const calls = await Promise.allSettled(started);
        clearTimeout(safety);
        const denied = calls.filter((c) => c.status === "rejected");
        assert.equal(calls.length - denied.length, 2);
        for (const d of denied) {
          assert.ok(d.reason instanceof BudgetDenied, `${d.reason}`);
          assert.equal(d.reason.reason, "REASON_CONCURRENCY_EXCEEDED");
          assert.ok(d.reason.retryAfterMs > 0);
        }
        assert.deepEqual(await status(user), { spent: 10, held: 0 });
      });
    });
  }
});
