/**
 * Every error the client throws: a {@link BudgetError} with the gRPC status
 * name the service answered (`.code`) and its message (`.details`), or a
 * {@link BudgetDenied} from the helpers, which turn a denial into an error.
 */
import type { CheckAndReserveResponse } from "./types.js";

/** An error of the service or of reaching it. */
export class BudgetError extends Error {
  /** The gRPC status name: `INVALID_ARGUMENT`, `UNAVAILABLE`, … */
  readonly code: string;
  /** What the service said (empty when it said nothing). */
  readonly details: string;

  constructor(code: string, details: string, options?: { cause?: unknown }) {
    super(details ? `${code}: ${details}` : code, options);
    this.name = new.target.name;
    this.code = code;
    this.details = details;
  }
}

/** Bad input: a field the service refused, a malformed or forged reservation id. */
export class BudgetInvalidArgument extends BudgetError {}

/** A well-formed reservation that no longer exists (settled, or its record expired). */
export class BudgetNotFound extends BudgetError {}

/** No token, a wrong one, or a token bound to other tenants. */
export class BudgetPermissionDenied extends BudgetError {}

/** The service unreachable, too slow for the timeout, or answering UNAVAILABLE. */
export class BudgetUnavailable extends BudgetError {}

/**
 * A reservation the service denied, thrown by `withReservation` and the AI
 * SDK middleware (`checkAndReserve` returns denials as answers). Show
 * `retryAfterMs` to the caller.
 */
export class BudgetDenied extends BudgetError {
  /** The denial's reason (`REASON_TPM_EXCEEDED`, …). */
  readonly reason: CheckAndReserveResponse["reason"];
  /** The level whose limit denied (`LEVEL_USER`, …). */
  readonly level: CheckAndReserveResponse["limitingLevel"];
  /** When to try again, in milliseconds. */
  readonly retryAfterMs: number;
  /** The whole answer. */
  readonly decision: CheckAndReserveResponse;

  constructor(decision: CheckAndReserveResponse) {
    super("RESOURCE_EXHAUSTED", decision.detail || decision.reason);
    this.decision = decision;
    this.reason = decision.reason;
    this.level = decision.limitingLevel;
    this.retryAfterMs = decision.retryAfterMs;
  }
}

/** The error class for a status name. */
export function errorFor(code: string, details: string, cause?: unknown): BudgetError {
  const options = cause === undefined ? undefined : { cause };
  switch (code) {
    case "INVALID_ARGUMENT":
    case "OUT_OF_RANGE":
      return new BudgetInvalidArgument(code, details, options);
    case "NOT_FOUND":
      return new BudgetNotFound(code, details, options);
    case "PERMISSION_DENIED":
    case "UNAUTHENTICATED":
      return new BudgetPermissionDenied(code, details, options);
    case "UNAVAILABLE":
    case "DEADLINE_EXCEEDED":
      return new BudgetUnavailable(code, details, options);
    default:
      return new BudgetError(code, details, options);
  }
}
