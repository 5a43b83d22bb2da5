/**
 * Reserve → call → settle, as docs/http.md says a stream settles: commit
 * the usage the provider reported; else, when output reached the caller,
 * commit the prompt as reserved and the text delivered (the service counts
 * it); else refund. A callback that throws refunds, unless output was
 * already delivered: then what was delivered is paid for.
 */
import { BudgetDenied } from "./errors.js";
import type { BudgetClient, CallOptions } from "./client.js";
import type { CheckAndReserveRequest, CheckAndReserveResponse, CommitRequest } from "./types.js";

/** The usage a provider reported. */
export interface Usage {
  promptTokens: number;
  completionTokens: number;
  cachedPromptTokens?: number;
  reasoningTokens?: number;
}

/** A granted reservation, while the call it pays for runs. */
export interface Grant extends CheckAndReserveResponse {
  /** The usage the provider reported: committed as is. */
  setUsage(usage: Usage): void;
  /** Output that reached the caller (call it per chunk): committed if no usage is set. */
  recordOutput(text: string): void;
}

/** What a reservation will settle as. */
class Settlement {
  usage: Usage | undefined;
  output = "";
  delivered = false;

  constructor(readonly decision: CheckAndReserveResponse) {}

  /** The Commit, or `undefined` for a Refund; `failed`: the call threw. */
  commit(failed: boolean): CommitRequest | undefined {
    const id = this.decision.reservationId;
    if (this.usage && (this.delivered || !failed)) {
      const u = this.usage;
      return {
        reservationId: id,
        promptTokens: u.promptTokens,
        completionTokens: u.completionTokens,
        cachedPromptTokens: u.cachedPromptTokens ?? 0,
        reasoningTokens: u.reasoningTokens ?? 0,
      };
    }
    if (this.delivered) {
      const output = this.decision.reservedOutputTokens || this.decision.grantedMaxOutputTokens;
      return {
        reservationId: id,
        promptTokens: Math.max(this.decision.reservedTokens - output, 0),
        completionText: this.output,
      };
    }
    return undefined;
  }
}

/** See {@link BudgetClient.withReservation}. */
export async function withReservation<R>(
  client: BudgetClient,
  request: CheckAndReserveRequest,
  fn: (grant: Grant) => Promise<R> | R,
  options?: CallOptions,
): Promise<R> {
  const decision = await client.checkAndReserve(request, options);
  if (!decision.allowed) throw new BudgetDenied(decision);
  const settlement = new Settlement(decision);
  const grant: Grant = {
    ...decision,
    setUsage(usage) {
      settlement.usage = { ...usage };
    },
    recordOutput(text) {
      if (text) {
        settlement.output += text;
        settlement.delivered = true;
      }
    },
  };
  let result: R;
  try {
    result = await fn(grant);
  } catch (e) {
    await settle(client, settlement, true);
    throw e;
  }
  await settle(client, settlement, false);
  return result;
}

/** Commits or refunds; the caller's signal is not passed: a settlement must land. */
async function settle(client: BudgetClient, s: Settlement, failed: boolean): Promise<void> {
  const commit = s.commit(failed);
  if (commit) await client.commit(commit);
  else await client.refund({ reservationId: s.decision.reservationId });
}
