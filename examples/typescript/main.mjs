// An AI SDK app whose calls ctxbudget budgets: the model is wrapped once
// with `budgetMiddleware` and every call through it is reserved, capped at
// the output granted, committed at the usage the provider reports, or
// refused with the time to retry. examples/typescript/README.md runs it
// against the repository's mock upstream (examples/python/mock_upstream.py).
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { generateText, streamText, wrapLanguageModel } from "ai";
import { BudgetClient, BudgetDenied, budgetMiddleware } from "ctxbudget";

const env = (name, fallback) => process.env[name] ?? fallback;
const budget = new BudgetClient({ baseUrl: env("CTXBUDGET_URL", "http://127.0.0.1:8080"), token: process.env.CTXBUDGET_TOKEN });
const provider = createOpenAICompatible({
  name: "upstream",
  baseURL: `${env("UPSTREAM_URL", "http://127.0.0.1:8000")}/v1`,
  apiKey: env("UPSTREAM_KEY", "sk-mock"),
  includeUsage: true,
});

// The one line: every call through `model` is budgeted for the user it names.
const model = wrapLanguageModel({
  model: provider("gpt-4o-mini"),
  middleware: budgetMiddleware({ client: budget, tenant: "acme", tier: "free", user: (call) => String(call.providerOptions?.app?.user ?? "anonymous") }),
});

const alice = { app: { user: "alice" } };
const answer = await generateText({ model, prompt: "Say something short about budgets.", providerOptions: alice, maxRetries: 0 });
console.log(`generate: ${answer.text.slice(0, 40)}… (${answer.usage.inputTokens} in, ${answer.usage.outputTokens} out)`);

const stream = streamText({ model, prompt: "Stream a few words about budgets.", providerOptions: alice, maxRetries: 0 });
let streamed = "";
for await (const chunk of stream.textStream) streamed += chunk;
console.log(`stream: ${streamed.length} characters`);

const status = await budget.getStatus({ tenantId: "acme", userId: "alice", tier: "free" });
const requests = status.limits.find((l) => l.level === "LEVEL_USER" && l.dimension === "DIMENSION_REQUESTS");
console.log(`alice has ${requests.remaining} of ${requests.limit} requests left this minute`);

// A user past their limit is refused before the provider is called.
try {
  for (let i = 0; i < 20; i++) {
    await generateText({ model, prompt: "Again.", providerOptions: { app: { user: "bob" } }, maxRetries: 0 });
  }
  console.log("bob was never refused");
  process.exitCode = 1;
} catch (e) {
  if (!(e instanceof BudgetDenied)) throw e;
  console.log(`bob: refused (${e.reason} at ${e.level}), retry in ${Math.ceil(e.retryAfterMs / 1000)} s`);
}
