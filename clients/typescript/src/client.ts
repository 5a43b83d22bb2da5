/**
 * `BudgetClient`: one method per `BudgetService` RPC over the HTTP/JSON API
 * (`POST /v1/<rpc>`, docs/http-api.md), so it runs wherever `fetch` does.
 * A denial is an answer (`allowed: false`), not an error; errors are
 * {@link BudgetError}s. Nothing is retried unless `retry` says so, and then
 * only UNAVAILABLE, on reads and on reservations that carry an idempotency
 * key (the service returns the first reservation to the retry).
 */
import { BudgetError, BudgetUnavailable, errorFor } from "./errors.js";
import { withReservation, type Grant } from "./reservation.js";
import type * as T from "./types.js";
import { fromWire, toWire } from "./wire.js";

/** How a {@link BudgetClient} reaches the service. */
export interface BudgetClientOptions {
  /** The HTTP listener, e.g. `http://ctxbudget:8080`. */
  baseUrl: string;
  /** A `[[auth.tokens]]` token, sent as `Authorization: Bearer …`. */
  token?: string;
  /** Each call's deadline (default 2,000 ms); a call past it is {@link BudgetUnavailable}. */
  timeoutMs?: number;
  /** The `fetch` to use (default: the global one). */
  fetch?: typeof fetch;
  /** Retries of UNAVAILABLE for reads and idempotent reservations (default: none). */
  retry?: { attempts: number; backoffMs: number };
}

/** Per-call options. */
export interface CallOptions {
  /** Cancels the call (it then rejects with the signal's reason). */
  signal?: AbortSignal;
  /** This call's deadline, instead of the client's. */
  timeoutMs?: number;
}

const PATHS = {
  CheckAndReserve: ["check-and-reserve", "CheckAndReserveResponse"],
  Commit: ["commit", "CommitResponse"],
  Refund: ["refund", "RefundResponse"],
  RenewLease: ["renew-lease", "RenewLeaseResponse"],
  GetStatus: ["get-status", "GetStatusResponse"],
  GetEstimator: ["get-estimator", "GetEstimatorResponse"],
} as const;

type Rpc = keyof typeof PATHS;

/** The budget service, over HTTP. */
export class BudgetClient {
  readonly #base: string;
  readonly #token: string | undefined;
  readonly #timeoutMs: number;
  readonly #fetch: typeof fetch;
  readonly #retry: { attempts: number; backoffMs: number } | undefined;

  constructor(options: BudgetClientOptions) {
    if (!options || typeof options.baseUrl !== "string" || !/^https?:\/\//.test(options.baseUrl)) {
      throw new TypeError("BudgetClient needs { baseUrl: 'http://host:port' } (the service's [http] listen)");
    }
    const timeoutMs = options.timeoutMs ?? 2000;
    if (!(timeoutMs > 0)) throw new TypeError(`timeoutMs: ${timeoutMs}; a deadline above 0 ms`);
    const retry = options.retry;
    if (retry && !(Number.isInteger(retry.attempts) && retry.attempts >= 1 && retry.backoffMs >= 0)) {
      throw new TypeError("retry: { attempts: an integer ≥ 1, backoffMs: ≥ 0 }");
    }
    this.#base = options.baseUrl.replace(/\/+$/, "");
    this.#token = options.token;
    this.#timeoutMs = timeoutMs;
    this.#fetch = options.fetch ?? globalThis.fetch.bind(globalThis);
    this.#retry = retry;
  }

  /** Reserves requests, tokens and a concurrency slot; a denial is `allowed: false`. */
  checkAndReserve(request: T.CheckAndReserveRequest, options?: CallOptions): Promise<T.CheckAndReserveResponse> {
    const idempotent = Boolean(request.idempotencyKey);
    return this.#call("CheckAndReserve", "CheckAndReserveRequest", request, options, idempotent);
  }

  /** Settles a reservation with the real usage. */
  commit(request: T.CommitRequest, options?: CallOptions): Promise<T.CommitResponse> {
    return this.#call("Commit", "CommitRequest", request, options, false);
  }

  /** Gives back all a reservation holds (the upstream call failed). */
  refund(request: T.RefundRequest, options?: CallOptions): Promise<T.RefundResponse> {
    return this.#call("Refund", "RefundRequest", request, options, false);
  }

  /** Extends a reservation's lease (a long stream). */
  renewLease(request: T.RenewLeaseRequest, options?: CallOptions): Promise<T.RenewLeaseResponse> {
    return this.#call("RenewLease", "RenewLeaseRequest", request, options, false);
  }

  /** The limits of a tenant (and user, session) now. */
  getStatus(request: T.GetStatusRequest, options?: CallOptions): Promise<T.GetStatusResponse> {
    return this.#call("GetStatus", "GetStatusRequest", request, options, true);
  }

  /** The adaptive estimator's state. */
  getEstimator(request: T.GetEstimatorRequest = {}, options?: CallOptions): Promise<T.GetEstimatorResponse> {
    return this.#call("GetEstimator", "GetEstimatorRequest", request, options, true);
  }

  /**
   * Reserves, runs `fn` with the grant, settles, and returns what `fn`
   * returned: commits the usage set, else the prompt as reserved and the
   * output recorded, else refunds. A denial throws {@link BudgetDenied}.
   */
  withReservation<R>(
    request: T.CheckAndReserveRequest,
    fn: (grant: Grant) => Promise<R> | R,
    options?: CallOptions,
  ): Promise<R> {
    return withReservation(this, request, fn, options);
  }

  async #call<Res>(rpc: Rpc, message: string, request: unknown, options: CallOptions | undefined, retryable: boolean): Promise<Res> {
    const attempts = retryable && this.#retry ? this.#retry.attempts : 1;
    for (let attempt = 1; ; attempt++) {
      try {
        return await this.#once<Res>(rpc, message, request, options);
      } catch (e) {
        if (!(e instanceof BudgetUnavailable) || attempt >= attempts || options?.signal?.aborted) throw e;
        await sleep((this.#retry?.backoffMs ?? 0) * attempt, options?.signal);
      }
    }
  }

  async #once<Res>(rpc: Rpc, message: string, request: unknown, options: CallOptions | undefined): Promise<Res> {
    const [path, answer] = PATHS[rpc];
    const timeoutMs = options?.timeoutMs ?? this.#timeoutMs;
    const deadline = AbortSignal.timeout(timeoutMs);
    const signal = options?.signal ? anyOf([options.signal, deadline]) : deadline;
    const headers: Record<string, string> = { "content-type": "application/json" };
    if (this.#token) headers.authorization = `Bearer ${this.#token}`;
    let response: Response;
    let body: unknown;
    try {
      response = await this.#fetch(`${this.#base}/v1/${path}`, {
        method: "POST",
        headers,
        body: toWire(request, message),
        signal,
      });
      body = await response.json();
    } catch (e) {
      if (options?.signal?.aborted) throw options.signal.reason;
      if (deadline.aborted) throw new BudgetUnavailable("DEADLINE_EXCEEDED", `no answer within ${timeoutMs} ms`, { cause: e });
      throw new BudgetUnavailable("UNAVAILABLE", `cannot reach ${this.#base}: ${(e as Error)?.message ?? e}`, { cause: e });
    }
    const error = (body as { error?: { status?: string; message?: string } } | null)?.error;
    if (error) throw errorFor(error.status ?? "UNKNOWN", error.message ?? "");
    // A denied CheckAndReserve answers its decision with 429, 413 or 403.
    if (!response.ok && !(rpc === "CheckAndReserve" && body && typeof body === "object" && "allowed" in body)) {
      throw new BudgetError(response.status >= 500 ? "UNAVAILABLE" : "UNKNOWN", `HTTP ${response.status}`);
    }
    return fromWire<Res>(body as never, answer);
  }
}

/** A signal that aborts when any of `signals` does (AbortSignal.any where the runtime has it). */
function anyOf(signals: AbortSignal[]): AbortSignal {
  const native = (AbortSignal as unknown as { any?: (s: AbortSignal[]) => AbortSignal }).any;
  if (native) return native(signals);
  const controller = new AbortController();
  for (const s of signals) {
    if (s.aborted) return AbortSignal.abort(s.reason);
    s.addEventListener("abort", () => controller.abort(s.reason), { once: true });
  }
  return controller.signal;
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => {
      clearTimeout(timer);
      reject(signal.reason);
    }, { once: true });
  });
}
