/**
 * ctxbudget for JavaScript runtimes: {@link BudgetClient} over the HTTP/JSON
 * API, the messages' types (generated from docs/openapi.json), and the
 * errors it throws.
 */
export { BudgetClient, type BudgetClientOptions, type CallOptions } from "./client.js";
export {
  BudgetDenied,
  BudgetError,
  BudgetInvalidArgument,
  BudgetNotFound,
  BudgetPermissionDenied,
  BudgetUnavailable,
} from "./errors.js";
export type { Grant, Usage } from "./reservation.js";
export type * from "./types.js";
export { budgetMiddleware, type BudgetMiddleware, type BudgetMiddlewareOptions, type ModelCallOptions, type PerCall } from "./middleware.js";
