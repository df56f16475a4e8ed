#!/usr/bin/env node
// validate.mjs: offline validation of rendered Kubernetes manifests against the Kubernetes
// OpenAPI schemas (kubernetes-models, generated from the upstream OpenAPI spec) and the Prometheus
// Operator CRD schemas (@kubernetes-models/prometheus-operator). No cluster is contacted.
//
//   node deploy/tools/validate.mjs FILE.yaml [FILE.yaml ...]     (or "-" for stdin)
//
// Strict like `kubeconform -strict`: besides types, formats, enums and required fields, a field
// the schema does not define (a typo such as `readinesProbe`, or a field at the wrong level) is an
// error. The schemas come as compiled Ajv validators without their property lists, so strictness
// is measured: every object is wrapped in a Proxy that records which keys the validator looks up
// (it looks up every key its schema defines, and every key of a map); a key that was never looked
// up is unknown to the schema. An object the validator never looked into at all (a free-form
// field) is reported too, so nothing passes unchecked.
//
// Prints one line per error ("<file> doc <n> <Kind>/<name>: <path>: <message>") and a summary;
// exits 1 on any error or on a document of a kind it has no schema for, 0 otherwise.

import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { parseAllDocuments } from "yaml";

const here = dirname(fileURLToPath(import.meta.url));
const require = createRequire(join(here, "package.json"));

// apiVersion -> [package, folder inside the package]
function modelDir(apiVersion) {
  if (apiVersion.startsWith("monitoring.coreos.com/")) {
    return ["@kubernetes-models/prometheus-operator", apiVersion];
  }
  return ["kubernetes-models", apiVersion];  // "v1" for the core group, "apps/v1", ...
}

function packageRoot(pkg) {
  // The packages are ESM with an exports map; locate them through their package.json.
  return dirname(require.resolve(`${pkg}/package.json`, { paths: [here] }).replace(/\/package\.json$/, "/x"));
}

const validators = new Map();
async function validatorFor(apiVersion, kind) {
  const key = `${apiVersion}/${kind}`;
  if (validators.has(key)) return validators.get(key);
  const [pkg, folder] = modelDir(apiVersion);
  let root;
  try {
    root = packageRoot(pkg);
  } catch {
    throw new Error(`package ${pkg} is not installed (run deploy/tools/install.sh)`);
  }
  const modelFile = join(root, folder, `${kind}.js`);
  let source;
  try {
    source = readFileSync(modelFile, "utf8");
  } catch {
    validators.set(key, null);
    return null;
  }
  const m = source.match(/from\s*"(\.\.?\/[^"]*_schemas\/[^"]+\.js)"/);
  if (!m) throw new Error(`cannot find the schema import in ${modelFile}`);
  const schemaModule = await import(pathToFileURL(join(dirname(modelFile), m[1])).href);
  validators.set(key, schemaModule.validate);
  return schemaModule.validate;
}

// Wraps `value` so that every key lookup on every nested object is recorded in `seen`
// (object -> Set of keys looked up).
function track(value, seen) {
  if (value === null || typeof value !== "object") return value;
  const proxies = new WeakMap();
  const wrap = (obj) => {
    if (obj === null || typeof obj !== "object") return obj;
    if (proxies.has(obj)) return proxies.get(obj);
    const p = new Proxy(obj, {
      get(target, prop, receiver) {
        if (typeof prop === "string" && !Array.isArray(target)) {
          if (!seen.has(target)) seen.set(target, new Set());
          seen.get(target).add(prop);
        }
        return wrap(Reflect.get(target, prop, receiver));
      },
    });
    proxies.set(obj, p);
    return p;
  };
  return wrap(value);
}

// Keys present in `data` that the validator never looked up, as JSON pointers.
function unknownFields(data, seen, path = "") {
  const out = [];
  if (data === null || typeof data !== "object") return out;
  if (Array.isArray(data)) {
    data.forEach((v, i) => out.push(...unknownFields(v, seen, `${path}/${i}`)));
    return out;
  }
  const keys = Object.keys(data);
  const looked = seen.get(data);
  if (!looked) {
    if (keys.length) out.push(`${path || "/"}: not described by the schema (free-form object)`);
    return out;
  }
  for (const k of keys) {
    if (!looked.has(k)) {
      out.push(`${path}/${k}: unknown field`);
    } else {
      out.push(...unknownFields(data[k], seen, `${path}/${k}`));
    }
  }
  return out;
}

function readInput(file) {
  return file === "-" ? readFileSync(0, "utf8") : readFileSync(file, "utf8");
}

async function validateFile(file) {
  const errors = [];
  let count = 0;
  const docs = parseAllDocuments(readInput(file));
  for (const [i, doc] of docs.entries()) {
    const where = `${file} doc ${i + 1}`;
    if (doc.errors.length) {
      for (const e of doc.errors) errors.push(`${where}: YAML: ${e.message}`);
      continue;
    }
    const obj = doc.toJS();
    if (obj === null || obj === undefined) continue;  // empty document
    count++;
    const kind = obj.kind, apiVersion = obj.apiVersion;
    const name = obj.metadata?.name ?? "<no name>";
    const label = `${where} ${kind ?? "<no kind>"}/${name}`;
    if (typeof kind !== "string" || typeof apiVersion !== "string") {
      errors.push(`${label}: missing apiVersion or kind`);
      continue;
    }
    if (typeof obj.metadata?.name !== "string" || obj.metadata.name === "") {
      errors.push(`${label}: /metadata/name: required`);
    }
    const validate = await validatorFor(apiVersion, kind);
    if (!validate) {
      errors.push(`${label}: no schema for ${apiVersion} ${kind}`);
      continue;
    }
    const seen = new Map();
    const ok = validate(track(obj, seen));
    if (!ok) {
      for (const e of validate.errors ?? []) {
        const extra = e.params && Object.keys(e.params).length ? ` ${JSON.stringify(e.params)}` : "";
        errors.push(`${label}: ${e.instancePath || "/"}: ${e.message ?? e.keyword}${extra}`);
      }
    }
    for (const u of unknownFields(obj, seen)) errors.push(`${label}: ${u}`);
  }
  return { errors, count };
}

async function main() {
  const files = process.argv.slice(2);
  if (!files.length) {
    console.error("usage: validate.mjs FILE.yaml [FILE.yaml ...]   ('-' reads stdin)");
    process.exit(2);
  }
  let total = 0, bad = 0;
  for (const f of files) {
    const { errors, count } = await validateFile(f);
    total += count;
    bad += errors.length;
    for (const e of errors) console.log(e);
  }
  console.log(`validate: ${total} objects, ${bad} errors`);
  process.exit(bad ? 1 : 0);
}

main().catch((e) => {
  console.error(`validate: ${e.message}`);
  process.exit(2);
});
