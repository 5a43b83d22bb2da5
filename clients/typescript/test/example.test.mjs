// examples/typescript/main.mjs, an AI SDK app with one middleware line, run
// as its README says: against the service's built-in tiers and the
// repository's mock upstream (examples/python/mock_upstream.py, served by
// the Python environment scripts/test.sh makes).
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile, spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { join, resolve } from "node:path";
import { promisify } from "node:util";
import { freePort, startService } from "./service.mjs";

const REPO = resolve(import.meta.dirname, "../../..");
const EXAMPLE = join(REPO, "examples", "typescript");

test("the example's calls are reserved, capped, committed and refused", async () => {
  assert.ok(existsSync(join(EXAMPLE, "node_modules")), "run `npm ci` in examples/typescript first (scripts/test.sh does)");
  const python = process.env.PYTHON || join(REPO, "target", "venv", "bin", "python");
  const port = await freePort();
  const upstream = spawn(python, ["-m", "uvicorn", "mock_upstream:app", "--app-dir", join(REPO, "examples", "python"), "--host", "127.0.0.1", "--port", String(port), "--log-level", "warning"], { stdio: "ignore" });
  const service = await startService("");
  const upstreamUrl = `http://127.0.0.1:${port}`;
  try {
    for (let i = 0; ; i++) {
      try {
        await fetch(`${upstreamUrl}/stats`);
        break;
      } catch (e) {
        if (i > 300) throw e;
        await new Promise((ok) => setTimeout(ok, 100));
      }
    }
    const { stdout } = await promisify(execFile)("node", ["main.mjs"], {
      cwd: EXAMPLE,
      env: { ...process.env, CTXBUDGET_URL: service.baseUrl, UPSTREAM_URL: upstreamUrl },
    });
    const lines = stdout.trim().split("\n");
    assert.match(lines[0], /^generate: .+ \(\d+ in, \d+ out\)$/);
    assert.match(lines[1], /^stream: [1-9]\d* characters$/);
    assert.equal(lines[2], "alice has 8 of 10 requests left this minute");
    assert.match(lines[3], /^bob: refused \(REASON_RPM_EXCEEDED at LEVEL_USER\), retry in \d+ s$/);
    // Every call reached the provider capped at the grant: the free tier's
    // default output, 4,096 tokens, as the caller asked for none.
    const received = await (await fetch(`${upstreamUrl}/received`)).json();
    assert.equal(received.length, 2 + 10, "alice's two calls and bob's ten; bob's eleventh never left");
    for (const { body } of received) assert.equal(body.max_tokens ?? body.max_completion_tokens, 4096);
  } finally {
    await service.stop();
    upstream.kill("SIGTERM");
  }
});
