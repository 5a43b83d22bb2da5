// Test fixtures: the repository's ctxbudget binary (CTXBUDGET_BIN, else
// target/debug/ctxbudget) serving its HTTP API on a free port, over the
// memory store or a redis-server started here; stopped by PID.
import { spawn } from "node:child_process";
import { mkdtempSync, writeFileSync, existsSync } from "node:fs";
import { createServer, connect } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";

const REPO = resolve(import.meta.dirname, "../../..");

export const TOKEN = "ts-client-token-0123456789";
export const BOUND = "ts-bound-token-0123456789a";

export const CONFIG = `
[reservations]
retry_jitter_ms = 0
retention_ms = 1000

[[auth.tokens]]
name = "gateway"
token = "${TOKEN}"

[[auth.tokens]]
name = "acme-only"
token = "${BOUND}"
tenants = ["acme"]

[tiers.free]
max_context_tokens = 8000
default_max_output_tokens = 50
user = { requests = [{ limit = 3, period = "1h" }], tokens = [{ limit = 100000, period = "1d" }], concurrency = 2 }
`;

export function freePort() {
  return new Promise((ok, fail) => {
    const s = createServer();
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => ok(port));
    });
    s.on("error", fail);
  });
}

async function waitFor(check, what, ms = 30000) {
  const until = Date.now() + ms;
  for (;;) {
    if (await check()) return;
    if (Date.now() > until) throw new Error(`${what} within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

const listening = (port) =>
  new Promise((ok) => {
    const c = connect(port, "127.0.0.1", () => { c.end(); ok(true); });
    c.on("error", () => ok(false));
  });

/** A redis-server on a free port. */
export async function startRedis() {
  const port = await freePort();
  const proc = spawn("redis-server", ["--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"], { stdio: "ignore" });
  await waitFor(() => listening(port), "redis-server answers");
  return { url: `redis://127.0.0.1:${port}/0`, stop: () => proc.kill("SIGTERM") };
}

/** A ctxbudget service on `config` (and `redisUrl`): its HTTP base URL, and stop(). */
export async function startService(config = CONFIG, redisUrl) {
  const bin = process.env.CTXBUDGET_BIN || join(REPO, "target", "debug", "ctxbudget");
  if (!existsSync(bin)) throw new Error(`no ctxbudget binary at ${bin}: run \`cargo build\` (or set CTXBUDGET_BIN)`);
  const dir = mkdtempSync(join(tmpdir(), "ctxbudget-ts-"));
  writeFileSync(join(dir, "config.toml"), config);
  const [grpc, http] = [await freePort(), await freePort()];
  const args = ["serve", "--listen", `127.0.0.1:${grpc}`, "--http-listen", `127.0.0.1:${http}`, "--config", join(dir, "config.toml")];
  if (redisUrl) args.push("--redis-url", redisUrl);
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("CTXBUDGET_")));
  const proc = spawn(bin, args, { stdio: "ignore", env });
  await waitFor(() => listening(http), "ctxbudget's HTTP listener answers");
  return {
    baseUrl: `http://127.0.0.1:${http}`,
    stop: () => new Promise((ok) => { proc.once("exit", ok); proc.kill("SIGTERM"); }),
  };
}
