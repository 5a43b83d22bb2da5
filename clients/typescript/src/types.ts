/**
 * The messages of the service, as the client takes and returns them: the
 * types generated from docs/openapi.json (`generated/openapi.ts`), with
 * every 64-bit count a plain `number` in answers and a `number`, `bigint`
 * or numeric string in requests.
 */
import type { components } from "./generated/openapi.js";

type Schemas = components["schemas"];

/** A field the document types as a 64-bit count (`string | integer`). */
type IsCount<X> = [X] extends [string | number] ? ([string | number] extends [X] ? true : false) : false;

/** An answer: counts as numbers, every field present (the service writes them all). */
export type Answer<T> = T extends readonly (infer E)[]
  ? Answer<E>[]
  : T extends object
    ? { [K in keyof T]-?: IsCount<NonNullable<T[K]>> extends true ? number : Answer<NonNullable<T[K]>> }
    : T;

/** A request: counts as numbers, bigints or numeric strings. */
export type Ask<T> = T extends readonly (infer E)[]
  ? Ask<E>[]
  : T extends object
    ? { [K in keyof T]: IsCount<NonNullable<T[K]>> extends true ? number | bigint | string : Ask<T[K]> }
    : T;

export type CheckAndReserveRequest = Ask<Schemas["CheckAndReserveRequest"]>;
export type CheckAndReserveResponse = Answer<Schemas["CheckAndReserveResponse"]>;
export type CommitRequest = Ask<Schemas["CommitRequest"]>;
export type CommitResponse = Answer<Schemas["CommitResponse"]>;
export type RefundRequest = Ask<Schemas["RefundRequest"]>;
export type RefundResponse = Answer<Schemas["RefundResponse"]>;
export type RenewLeaseRequest = Ask<Schemas["RenewLeaseRequest"]>;
export type RenewLeaseResponse = Answer<Schemas["RenewLeaseResponse"]>;
export type GetStatusRequest = Ask<Schemas["GetStatusRequest"]>;
export type GetStatusResponse = Answer<Schemas["GetStatusResponse"]>;
export type GetEstimatorRequest = Ask<Schemas["GetEstimatorRequest"]>;
export type GetEstimatorResponse = Answer<Schemas["GetEstimatorResponse"]>;
export type Message = Ask<Schemas["Message"]>;
export type LimitStatus = Answer<Schemas["LimitStatus"]>;
export type Reason = Schemas["Reason"];
export type Level = Schemas["Level"];
export type Dimension = Schemas["Dimension"];
export type Priority = Schemas["Priority"];
export type Outcome = Schemas["Outcome"];
