// Type check (tsc, not run): the middleware fits `wrapLanguageModel` in
// `ai` 7 and in `ai` 6 (installed as `ai6`), for one wrapped model serving
// many users.
import { wrapLanguageModel } from "ai";
import { MockLanguageModelV4 } from "ai/test";
import { wrapLanguageModel as wrapLanguageModel6 } from "ai6";
import { MockLanguageModelV3 } from "ai6/test";
import { BudgetClient, budgetMiddleware } from "../../src/index.js";

const client = new BudgetClient({ baseUrl: "http://127.0.0.1:8080" });
const middleware = budgetMiddleware({
  client,
  tenant: "acme",
  user: (call) => String(call.providerOptions?.app?.user ?? "anonymous"),
  tier: "pro",
  priority: "PRIORITY_BATCH",
});
export const seven = wrapLanguageModel({ model: new MockLanguageModelV4(), middleware });
export const six = wrapLanguageModel6({ model: new MockLanguageModelV3(), middleware });
