/**
 * Budgets in the Vercel AI SDK: `budgetMiddleware` for `wrapLanguageModel`.
 * Each call is reserved before the provider is called (the prompt sent as
 * messages, counted by the service; the model's `modelId` as the model), is
 * capped at the output granted, and is settled as docs/http.md says: the
 * usage the provider reports, else the prompt and the text delivered, else
 * a refund. A denial throws {@link BudgetDenied}.
 *
 * Written against the AI SDK's language-model middleware as `ai` 6 (models
 * v3) and 7 (models v4) define it: both carry the same prompt, usage and
 * stream parts, so the types below are the part of them this reads.
 */
import type { BudgetClient } from "./client.js";
import { BudgetDenied, BudgetUnavailable } from "./errors.js";
import type { CheckAndReserveRequest, CheckAndReserveResponse, CommitRequest, Priority } from "./types.js";

/** The parts of a model call's options this reads. */
export interface ModelCallOptions {
  prompt: ReadonlyArray<{ role: string; content: unknown }>;
  maxOutputTokens?: number | undefined;
  providerOptions?: Record<string, Record<string, unknown> | undefined> | undefined;
  abortSignal?: AbortSignal | undefined;
}

interface ModelUsage {
  inputTokens?: { total?: number | undefined; cacheRead?: number | undefined } | undefined;
  outputTokens?: { total?: number | undefined; reasoning?: number | undefined } | undefined;
}

interface GenerateResult {
  content?: ReadonlyArray<{ type: string; text?: string }>;
  usage?: ModelUsage;
}

interface StreamResult {
  stream: ReadableStream<unknown>;
}

/** A value, or a function of the call's options. */
export type PerCall<T> = T | ((options: ModelCallOptions) => T);

/** What {@link budgetMiddleware} reserves for. */
export interface BudgetMiddlewareOptions {
  /** The client of the service. */
  client: BudgetClient;
  /** The tenant charged. */
  tenant: PerCall<string>;
  /** The user charged. */
  user: PerCall<string>;
  /** The tier whose limits apply. */
  tier: PerCall<string>;
  /** A session (an agent run) with a budget of its own. */
  session?: PerCall<string | undefined>;
  /** The call's priority class (`PRIORITY_BATCH`, …). */
  priority?: PerCall<Priority | undefined>;
  /** The service unreachable: `deny` (the default) throws, `allow` calls the provider unbudgeted. */
  onUnavailable?: "deny" | "allow";
}

/**
 * The AI SDK middleware. Its `specificationVersion` types as `never` so that
 * it fits both `ai` 6's (`"v3"`) and `ai` 7's (`"v4"`) middleware type; the
 * SDK does not read it.
 */
export interface BudgetMiddleware {
  readonly specificationVersion: never;
  transformParams<P extends ModelCallOptions>(o: { type: "generate" | "stream"; params: P; model: { modelId: string } }): Promise<P>;
  wrapGenerate<R extends GenerateResult>(o: { doGenerate: () => PromiseLike<R>; params: ModelCallOptions }): Promise<R>;
  wrapStream<R extends StreamResult>(o: { doStream: () => PromiseLike<R>; params: ModelCallOptions }): Promise<R>;
}

/** The reservations of calls under way, by the parameters they were made for. */
type Held = WeakMap<object, Settling>;

/**
 * `wrapLanguageModel({ model, middleware: budgetMiddleware({ client, tenant, user, tier }) })`.
 * `providerOptions.ctxbudget` on a call overrides `tenant`, `user`, `tier`,
 * `session` and `priority`.
 */
export function budgetMiddleware(options: BudgetMiddlewareOptions): BudgetMiddleware {
  if (!options?.client) throw new TypeError("budgetMiddleware needs { client, tenant, user, tier }");
  const onUnavailable = options.onUnavailable ?? "deny";
  if (onUnavailable !== "deny" && onUnavailable !== "allow") {
    throw new TypeError(`onUnavailable: ${String(onUnavailable)}; "deny" or "allow"`);
  }
  const held: Held = new WeakMap();
  return {
    specificationVersion: "v4" as never,
    async transformParams({ params, model }) {
      let decision: CheckAndReserveResponse;
      try {
        decision = await options.client.checkAndReserve(reservation(options, params, model.modelId), {
          signal: params.abortSignal,
        });
      } catch (e) {
        if (e instanceof BudgetUnavailable && onUnavailable === "allow") return params;
        throw e;
      }
      if (!decision.allowed) throw new BudgetDenied(decision);
      const granted = decision.grantedMaxOutputTokens;
      const asked = params.maxOutputTokens;
      const capped: typeof params = { ...params, maxOutputTokens: asked === undefined ? granted : Math.min(asked, granted) };
      held.set(capped, new Settling(options.client, decision));
      return capped;
    },
    async wrapGenerate({ doGenerate, params }) {
      const settling = held.get(params);
      if (!settling) return await doGenerate();
      let result;
      try {
        result = await doGenerate();
      } catch (e) {
        await settling.settle(undefined, true);
        throw e;
      }
      for (const part of result.content ?? []) {
        if (part.type === "text" && part.text) settling.delivered(part.text);
      }
      await settling.settle(result.usage, false);
      return result;
    },
    async wrapStream({ doStream, params }) {
      const settling = held.get(params);
      if (!settling) return await doStream();
      let result;
      try {
        result = await doStream();
      } catch (e) {
        await settling.settle(undefined, true);
        throw e;
      }
      return { ...result, stream: result.stream.pipeThrough(recording(settling)) };
    },
  };
}

/** The reservation for a call with `params` to `modelId`. */
function reservation(options: BudgetMiddlewareOptions, params: ModelCallOptions, modelId: string): CheckAndReserveRequest {
  const own = (params.providerOptions?.ctxbudget ?? {}) as Record<string, unknown>;
  const pick = <T>(name: string, value: PerCall<T> | undefined): T | undefined =>
    (own[name] as T | undefined) ?? (typeof value === "function" ? (value as (o: ModelCallOptions) => T)(params) : value);
  const request: CheckAndReserveRequest = {
    tenantId: pick("tenant", options.tenant) ?? "",
    userId: pick("user", options.user) ?? "",
    tier: pick("tier", options.tier) ?? "",
    model: modelId,
    messages: params.prompt.map((m) => ({ role: m.role, content: textOf(m.content) })),
  };
  const session = pick("session", options.session);
  if (session) request.sessionId = session;
  const priority = pick("priority", options.priority);
  if (priority) request.priority = priority;
  if (params.maxOutputTokens !== undefined) request.maxOutputTokens = params.maxOutputTokens;
  return request;
}

/** A message's text: a string, or its text parts (tool calls and results as their JSON). */
function textOf(content: unknown): string {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) return "";
  return content
    .map((part: { type?: string; text?: string; input?: unknown; output?: unknown }) => {
      if (typeof part.text === "string") return part.text;
      if (part.type === "tool-call") return JSON.stringify(part.input ?? null);
      if (part.type === "tool-result") return JSON.stringify(part.output ?? null);
      return "";
    })
    .join("");
}

/** Passes a stream's parts through, noting the text delivered and the usage reported; settles at its end. */
function recording(settling: Settling): TransformStream<unknown, unknown> {
  let usage: ModelUsage | undefined;
  let failed = false;
  return new TransformStream({
    transform(part, controller) {
      const p = part as { type?: string; delta?: string; usage?: ModelUsage };
      if (p.type === "text-delta" && p.delta) settling.delivered(p.delta);
      else if (p.type === "finish") usage = p.usage;
      else if (p.type === "error") failed = true;
      controller.enqueue(part);
    },
    async flush() {
      await settling.settle(usage, failed);
    },
    // The reader cancelled (the caller went away): what it got is paid for.
    async cancel() {
      await settling.settle(undefined, true);
    },
  } as Transformer<unknown, unknown> & { cancel(): Promise<void> });
}

/** One call's reservation until it is settled, once. */
class Settling {
  #text = "";
  #done = false;

  constructor(
    readonly client: BudgetClient,
    readonly decision: CheckAndReserveResponse,
  ) {}

  delivered(text: string): void {
    this.#text += text;
  }

  /** Commits `usage` (when complete and the call did not fail, or output was delivered), else the text delivered, else refunds. */
  async settle(usage: ModelUsage | undefined, failed: boolean): Promise<void> {
    if (this.#done) return;
    this.#done = true;
    const id = this.decision.reservationId;
    const input = usage?.inputTokens?.total;
    const output = usage?.outputTokens?.total;
    let commit: CommitRequest | undefined;
    if (input !== undefined && output !== undefined && (!failed || this.#text)) {
      commit = {
        reservationId: id,
        promptTokens: input,
        completionTokens: output,
        cachedPromptTokens: usage?.inputTokens?.cacheRead ?? 0,
        reasoningTokens: usage?.outputTokens?.reasoning ?? 0,
      };
    } else if (this.#text) {
      const reservedOutput = this.decision.reservedOutputTokens || this.decision.grantedMaxOutputTokens;
      commit = {
        reservationId: id,
        promptTokens: Math.max(this.decision.reservedTokens - reservedOutput, 0),
        completionText: this.#text,
      };
    }
    if (commit) await this.client.commit(commit);
    else await this.client.refund({ reservationId: id });
  }
}
