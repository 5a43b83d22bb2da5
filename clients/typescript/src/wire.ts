/**
 * Messages to and from their JSON on the wire: protobuf's JSON mapping
 * writes 64-bit counts as strings; the client's callers see numbers. The
 * table of which fields are counts is generated from docs/openapi.json
 * (`generated/int64.ts`).
 */
import { FIELDS } from "./generated/int64.js";

type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** Walks `value`, a `message`, applying `count` to every 64-bit field. */
function walk(value: unknown, message: string, count: (v: unknown) => unknown): unknown {
  const fields = FIELDS[message];
  if (fields === undefined || value === null || typeof value !== "object" || Array.isArray(value)) {
    return value;
  }
  const out: Record<string, unknown> = { ...(value as Record<string, unknown>) };
  for (const [name, kind] of Object.entries(fields)) {
    const v = out[name];
    if (v === undefined || v === null) continue;
    if (kind === "int64") out[name] = count(v);
    else if (kind === "int64[]" && Array.isArray(v)) out[name] = v.map(count);
    else if (kind === "{int64}") out[name] = mapValues(v, count);
    else if (kind.endsWith("[]") && Array.isArray(v)) out[name] = v.map((e) => walk(e, kind.slice(0, -2), count));
    else if (kind.startsWith("{")) out[name] = mapValues(v, (e) => walk(e, kind.slice(1, -1), count));
    else out[name] = walk(v, kind, count);
  }
  return out;
}

function mapValues(v: unknown, f: (e: unknown) => unknown): unknown {
  if (v === null || typeof v !== "object") return v;
  return Object.fromEntries(Object.entries(v as Record<string, unknown>).map(([k, e]) => [k, f(e)]));
}

/** `request`, a `message`, as JSON: bigints become decimal strings. */
export function toWire(request: unknown, message: string): string {
  const ready = walk(request, message, (v) => (typeof v === "bigint" ? v.toString() : v));
  return JSON.stringify(ready);
}

/** An answer, a `message`, from its JSON: counts become numbers. */
export function fromWire<T>(json: Json, message: string): T {
  return walk(json, message, (v) => (typeof v === "string" && v !== "" ? Number(v) : v)) as T;
}
