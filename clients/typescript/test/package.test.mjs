// The package as users get it: `npm pack`'s tarball installs into an empty
// project (no registry needed: it has no dependencies) and its entry point
// imports, with its type declarations beside it.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { existsSync, mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";

test("the tarball installs into an empty project and imports", () => {
  const pkg = resolve(import.meta.dirname, "..");
  const out = mkdtempSync(join(tmpdir(), "ctxbudget-pack-"));
  const tarball = execFileSync("npm", ["pack", "--silent", "--pack-destination", out], { cwd: pkg }).toString().trim().split("\n").pop();
  const app = mkdtempSync(join(tmpdir(), "ctxbudget-app-"));
  writeFileSync(join(app, "package.json"), JSON.stringify({ name: "app", private: true, type: "module" }));
  execFileSync("npm", ["install", "--silent", "--no-audit", "--no-fund", "--offline", join(out, tarball)], { cwd: app });
  writeFileSync(join(app, "main.mjs"), `import { BudgetClient, BudgetDenied } from "ctxbudget";
const c = new BudgetClient({ baseUrl: "http://127.0.0.1:1" });
console.log(typeof c.checkAndReserve, typeof c.withReservation, BudgetDenied.name);`);
  const printed = execFileSync("node", ["main.mjs"], { cwd: app }).toString().trim();
  assert.equal(printed, "function function BudgetDenied");
  assert.ok(existsSync(join(app, "node_modules", "ctxbudget", "dist", "index.d.ts")));
  assert.ok(!existsSync(join(app, "node_modules", "ctxbudget", "src")), "only dist and the README ship");
});
