// Fails when src/generated/ does not match docs/openapi.json: regenerates
// both files into a temporary directory with the same generators as
// `npm run generate` and compares. Run by scripts/test.sh.
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const dir = mkdtempSync(join(tmpdir(), "ctxbudget-ts-gen-"));
const doc = "../../docs/openapi.json";
execFileSync("npx", ["openapi-typescript", doc, "--output", join(dir, "openapi.ts")], { stdio: "ignore" });
execFileSync("node", ["scripts/int64-fields.mjs", doc, join(dir, "int64.ts")]);
const stale = ["openapi.ts", "int64.ts"].filter(
  (f) => readFileSync(join(dir, f), "utf8") !== readFileSync(join("src/generated", f), "utf8"),
);
if (stale.length) {
  console.error(`src/generated/${stale.join(", ")} do not match docs/openapi.json: run \`npm run generate\` in clients/typescript`);
  process.exit(1);
}
console.log("src/generated matches docs/openapi.json");
