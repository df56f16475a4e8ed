#!/usr/bin/env node
// wiring.mjs: checks that the rendered Kubernetes manifests (deploy/tools/check.sh output) are
// wired to the real binaries and to each other — what schema validation cannot see:
//   * every flag in a container's args exists in that binary's --help, and every $(VAR) in them
//     comes from the flags ConfigMap; ports (--port, --metrics-port) equal the binaries' defaults
//     (read from --help: one source of truth), the containerPorts, the probes and the Services;
//   * probes hit the real endpoints: ivy HTTP /health (liveness, startup) and /ready (readiness),
//     tulip grpc.health.v1 on its serving port;
//   * the shared-memory volume is a memory-backed emptyDir mounted at /dev/shm in both rose and
//     tulip, which name the same segment (rose --create-shm, tulip --attach) and the same model;
//   * ivy's --tulip-dns target is the headless Service, whose selector matches the worker pods;
//   * GPUs: rose requests nvidia.com/gpu (requests == limits, the overlay's count), tulip none;
//   * security context, resources, drain (grace >= preStop + drain), PDB/HPA/ServiceMonitor
//     targets, the weights volume, and the Dockerfiles (binary paths, uid, exposed ports, an
//     explicit --host=0.0.0.0: the binaries bind 127.0.0.1 by default);
//   * no back door through tulip [TAG_TULIP_TOKEN]: tulip listens on the pod's address and requires
//     the token (--auth-token-file) from a Secret volume that ivy presents from the same Secret
//     key (--tulip-token-file); a NetworkPolicy selects the worker pods and lets only ivy pods reach
//     the gRPC port (no namespace or IP peers, no rule without ports), and lets a scraper reach the
//     metrics port.
//
//   node tests/deploy/wiring.mjs --rendered DIR [--ivy BIN --tulip BIN --rose BIN] [--repo DIR]
//   node tests/deploy/wiring.mjs ... --self-test   (also proves each check can fail: applies
//                                                    known-bad edits and expects each to be caught)
// Without a binary, its flags come from a fallback table (printed as such). Exit 0 = all passed.

import { execFileSync } from "node:child_process";
import { readFileSync, existsSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const args = parseArgs(process.argv.slice(2));
const repo = resolve(args.repo ?? join(here, "..", ".."));
const require = createRequire(join(repo, "deploy", "tools", "package.json"));
const YAML = await import(require.resolve("yaml"));

function parseArgs(argv) {
  const out = {};
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === "--self-test") out.selfTest = true;
    else if (a.startsWith("--") && i + 1 < argv.length) out[a.slice(2)] = argv[++i];
    else { console.error(`wiring: bad argument ${a}`); process.exit(2); }
  }
  if (!out.rendered) { console.error("wiring: --rendered DIR is required"); process.exit(2); }
  return out;
}

// ---- the binaries' flags ------------------------------------------------------------------

// Used only while a binary is not built; the values the binaries were specified with.
const FALLBACK = {
  ivy: { port: "8080", host: "127.0.0.1", tulip: "127.0.0.1:50051", "model-dir": "", tokenizer: "",
         threads: "0", "max-body-bytes": "8388608", "tulip-token-file": "" },
  tulip: { host: "127.0.0.1", port: "50051", "metrics-port": "9091", model: "", device: "cpu",
           "shm-name": "", depth: "4", "max-batch-tokens": "8192", "rose-bin": "", attach: "",
           "drain-timeout-ms": "10000", "auth-token-file": "" },
  rose: { model: "", "shm-name": "", device: "cpu", "create-shm": "", depth: "4",
          "max-batch-tokens": "8192" },
};

// Flags the manifests use ahead of the binaries, per overlay: each must still be ABSENT from
// the binary's --help (when it appears, this entry must go: the check flips to failing).
const PENDING = {};

// "--name=TYPE   help text (default: X) [env Y]" lines of common/flags.cc's helpText().
export function parseHelp(text) {
  const flags = {};
  const lines = text.split("\n");
  for (let i = 0; i < lines.length; i++) {
    const m = lines[i].match(/^\s+--([a-z0-9][a-z0-9_-]*)(=\S+)?(\s+(.*))?$/);
    if (!m) continue;
    let desc = m[4] ?? "";
    if (!desc && i + 1 < lines.length && /^\s{20,}\S/.test(lines[i + 1])) desc = lines[i + 1].trim();
    const d = desc.match(/\(default: ([^)]*)\)/);
    flags[m[1]] = d ? d[1].replace(/^"(.*)"$/, "$1") : "";
  }
  return flags;
}

function loadFlags(name, bin) {
  if (bin && existsSync(bin)) {
    let text;
    try {
      text = execFileSync(bin, ["--help"], { encoding: "utf8", timeout: 10000 });
    } catch (e) {
      throw new Error(`${bin} --help failed: ${e.message}`);
    }
    const flags = parseHelp(text);
    if (!Object.keys(flags).length) throw new Error(`${bin} --help lists no flags`);
    return { flags, source: bin, binary: readFileSync(bin) };
  }
  return { flags: FALLBACK[name], source: "fallback table (binary not built)" };
}

// ---- manifest helpers ---------------------------------------------------------------------

function loadRendered(dir, name) {
  const docs = YAML.parseAllDocuments(readFileSync(join(dir, `${name}.yaml`), "utf8"));
  return docs.map((d) => d.toJS()).filter(Boolean);
}

function find(objs, kind, name) {
  return objs.find((o) => o.kind === kind && (name === undefined || o.metadata?.name === name));
}

function matches(selector, labels) {
  return Object.entries(selector ?? {}).every(([k, v]) => labels?.[k] === v) &&
    Object.keys(selector ?? {}).length > 0;
}

// Container args as {flag: value}; switches map to "true". $(VAR) resolved from env/ConfigMap.
function containerFlags(c, configMap, errors, where) {
  const env = {};
  for (const e of c.env ?? []) {
    if (e.value !== undefined) env[e.name] = e.value;
    else if (e.valueFrom?.configMapKeyRef) {
      const ref = e.valueFrom.configMapKeyRef;
      if (!configMap || ref.name !== configMap.metadata.name) {
        errors.push(`${where}: env ${e.name} refers to ConfigMap ${ref.name}, not the rendered flags ConfigMap`);
      } else if (!(ref.key in (configMap.data ?? {}))) {
        errors.push(`${where}: env ${e.name} refers to missing ConfigMap key ${ref.key}`);
      } else {
        env[e.name] = configMap.data[ref.key];
      }
    }
  }
  const flags = {};
  for (const a of c.args ?? []) {
    const m = a.match(/^--([a-z0-9][a-z0-9_-]*)(?:=(.*))?$/);
    if (!m) { errors.push(`${where}: argument '${a}' is not --flag or --flag=value`); continue; }
    const value = (m[2] ?? "true").replace(/\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g, (_, v) => {
      if (!(v in env)) errors.push(`${where}: --${m[1]} uses $(${v}), which is not in the container's env`);
      return env[v] ?? "";
    });
    if (m[1] in flags) errors.push(`${where}: --${m[1]} given twice`);
    flags[m[1]] = value;
  }
  return flags;
}

function portByName(c, nameOrNumber) {
  if (typeof nameOrNumber === "number") return nameOrNumber;
  return (c.ports ?? []).find((p) => p.name === nameOrNumber)?.containerPort;
}

function checkFlagsExist(flags, help, binary, where, pending, errors) {
  for (const f of Object.keys(flags)) {
    if (pending.includes(f)) {
      if (help.source !== FALLBACK_SOURCE && f in help.flags) {
        errors.push(`${where}: --${f} is listed as not yet implemented but ${binary} --help has it now: remove it from PENDING`);
      }
      continue;
    }
    if (!(f in help.flags)) errors.push(`${where}: --${f} is not a ${binary} flag (${help.source})`);
  }
}
const FALLBACK_SOURCE = "fallback table (binary not built)";

function checkContainerSecurity(pod, c, where, errors) {
  const sc = c.securityContext ?? {};
  const nonRoot = sc.runAsNonRoot ?? pod.securityContext?.runAsNonRoot;
  const uid = sc.runAsUser ?? pod.securityContext?.runAsUser;
  if (nonRoot !== true) errors.push(`${where}: runAsNonRoot is not true`);
  if (!(uid > 0)) errors.push(`${where}: no non-zero runAsUser`);
  if (sc.readOnlyRootFilesystem !== true) errors.push(`${where}: readOnlyRootFilesystem is not true`);
  if (sc.allowPrivilegeEscalation !== false) errors.push(`${where}: allowPrivilegeEscalation is not false`);
  if (sc.privileged === true) errors.push(`${where}: privileged`);
  if (!(sc.capabilities?.drop ?? []).includes("ALL")) errors.push(`${where}: capabilities do not drop ALL`);
  for (const kind of ["requests", "limits"]) {
    for (const r of ["cpu", "memory"]) {
      if (!c.resources?.[kind]?.[r]) errors.push(`${where}: no resources.${kind}.${r}`);
    }
  }
}

function mountOf(c, volume) {
  return (c.volumeMounts ?? []).find((m) => m.name === volume);
}

function preStopSleep(c) {
  return c.lifecycle?.preStop?.sleep?.seconds ?? 0;
}

// ---- the checks ---------------------------------------------------------------------------

const EXPECTED_GPUS = { embeddings: 1, "gpt-oss-20b": 1, "gpt-oss-120b": 4 };
// Seconds each tier takes to drain after SIGTERM (used when the binary has no drain flag).
// ivy's HTTP server drains for up to 10 s (HttpServerOptions::drain_timeout; no flag yet).
const IVY_DRAIN_S = 10;

export function checkOverlay(overlay, objs, help, dockerfiles) {
  const errors = [];
  const E = (m) => errors.push(`${overlay}: ${m}`);
  const pending = PENDING[overlay] ?? {};
  const cm = objs.find((o) => o.kind === "ConfigMap" && o.metadata.name.startsWith("garden-flags"));
  if (!cm) E("no garden-flags ConfigMap");
  const pvc = find(objs, "PersistentVolumeClaim");
  if (!pvc) E("no PersistentVolumeClaim for the weights");

  // --- ivy ---
  const ivyDep = find(objs, "Deployment", "ivy");
  const workerDep = find(objs, "Deployment", "garden-worker");
  const headless = find(objs, "Service", "tulip-headless");
  const ivySvc = find(objs, "Service", "ivy");
  if (!ivyDep || !workerDep || !headless || !ivySvc) {
    E("missing one of Deployment ivy, Deployment garden-worker, Service tulip-headless, Service ivy");
    return errors;
  }
  const ivyPod = ivyDep.spec.template.spec;
  const ivy = ivyPod.containers.find((c) => c.name === "ivy");
  if (!ivy) { E("ivy Deployment has no container 'ivy'"); return errors; }
  const ivyFlags = containerFlags(ivy, cm, errors, `${overlay}: ivy`);
  checkFlagsExist(ivyFlags, help.ivy, "ivy", `${overlay}: ivy`, pending.ivy ?? [], errors);
  const ivyPort = Number(help.ivy.flags.port);
  if (!(ivyPort > 0)) E(`ivy --help gives no default --port (${help.ivy.source})`);
  if (Number(ivyFlags.port) !== ivyPort) E(`ivy --port=${ivyFlags.port}, binary default ${ivyPort}`);
  if (portByName(ivy, "http") !== ivyPort) E(`ivy containerPort 'http' is ${portByName(ivy, "http")}, not ${ivyPort}`);
  if (ivyFlags.host !== "0.0.0.0") E(`ivy --host=${ivyFlags.host}: must listen on all interfaces in a pod`);
  const probes = { livenessProbe: "/health", startupProbe: "/health", readinessProbe: "/ready" };
  for (const [p, path] of Object.entries(probes)) {
    const h = ivy[p]?.httpGet;
    if (!h) { E(`ivy has no HTTP ${p}`); continue; }
    if (h.path !== path) E(`ivy ${p} path ${h.path}, expected ${path}`);
    if (portByName(ivy, h.port) !== ivyPort) E(`ivy ${p} port ${h.port} is not ${ivyPort}`);
  }
  if (!matches(ivySvc.spec.selector, ivyDep.spec.template.metadata.labels)) E("Service ivy does not select the ivy pods");
  for (const sp of ivySvc.spec.ports) {
    if (portByName(ivy, sp.targetPort) !== ivyPort) E(`Service ivy port ${sp.name} targets ${sp.targetPort}, not ivy's port`);
  }
  checkContainerSecurity(ivyPod, ivy, `${overlay}: ivy`, errors);
  const ivyDrain = "drain-timeout-ms" in help.ivy.flags
    ? Number(ivyFlags["drain-timeout-ms"] ?? help.ivy.flags["drain-timeout-ms"]) / 1000 : IVY_DRAIN_S;
  if (ivyPod.enableServiceLinks !== false) E("ivy pod has service links on (IVY_PORT=tcp://... would be read as --port)");
  const ivyGrace = ivyPod.terminationGracePeriodSeconds ?? 30;
  if (!(preStopSleep(ivy) > 0)) E("ivy has no preStop sleep (endpoint removal must propagate before SIGTERM)");
  if (ivyGrace < preStopSleep(ivy) + ivyDrain) E(`ivy terminationGracePeriodSeconds ${ivyGrace} < preStop ${preStopSleep(ivy)} + drain ${ivyDrain}`);

  // --- worker pod ---
  const wPod = workerDep.spec.template.spec;
  const wLabels = workerDep.spec.template.metadata.labels;
  const all = [...(wPod.initContainers ?? []), ...(wPod.containers ?? [])];
  const tulip = (wPod.containers ?? []).find((c) => c.name === "tulip");
  const rose = all.find((c) => c.name === "rose");
  if (!tulip || !rose) { E("worker pod needs containers 'tulip' and 'rose'"); return errors; }
  if ((wPod.initContainers ?? []).includes(rose) && rose.restartPolicy !== "Always") {
    E("rose is an init container without restartPolicy: Always (it would have to exit before tulip starts)");
  }
  const tf = containerFlags(tulip, cm, errors, `${overlay}: tulip`);
  const rf = containerFlags(rose, cm, errors, `${overlay}: rose`);
  checkFlagsExist(tf, help.tulip, "tulip", `${overlay}: tulip`, pending.tulip ?? [], errors);
  checkFlagsExist(rf, help.rose, "rose", `${overlay}: rose`, pending.rose ?? [], errors);
  const grpcPort = Number(help.tulip.flags.port);
  const metricsPort = Number(help.tulip.flags["metrics-port"]);
  if (!(grpcPort > 0) || !(metricsPort > 0)) E(`tulip --help gives no default --port/--metrics-port (${help.tulip.source})`);
  if (Number(tf.port) !== grpcPort) E(`tulip --port=${tf.port}, binary default ${grpcPort}`);
  if (Number(tf["metrics-port"]) !== metricsPort) E(`tulip --metrics-port=${tf["metrics-port"]}, binary default ${metricsPort}`);
  if (portByName(tulip, "grpc") !== grpcPort) E(`tulip containerPort 'grpc' is ${portByName(tulip, "grpc")}, not ${grpcPort}`);
  if (portByName(tulip, "metrics") !== metricsPort) E(`tulip containerPort 'metrics' is not ${metricsPort}`);
  // Readiness: grpc.health.v1 on the serving port, following rose's readiness.
  const rg0 = tulip.readinessProbe?.grpc;
  if (!rg0) E("tulip has no grpc readinessProbe (grpc.health.v1)");
  else {
    if (rg0.port !== grpcPort) E(`tulip readinessProbe grpc port ${rg0.port} is not tulip's --port ${grpcPort}`);
    if (!["", "garden.v1.Tulip", undefined].includes(rg0.service)) E(`tulip readinessProbe asks for service ${rg0.service}`);
  }
  // Liveness/startup: tulip's own liveness, not rose's readiness (every grpc.health.v1 service and
  // the metrics port's /health follow rose): /metrics on the metrics port.
  for (const p of ["livenessProbe", "startupProbe"]) {
    const h = tulip[p]?.httpGet;
    if (!h) { E(`tulip ${p} is not an HTTP probe of /metrics (grpc health follows rose's readiness)`); continue; }
    if (h.path !== "/metrics") E(`tulip ${p} path ${h.path}: only /metrics answers independently of rose`);
    if (portByName(tulip, h.port) !== metricsPort) E(`tulip ${p} port ${h.port} is not the metrics port ${metricsPort}`);
  }
  if (wPod.enableServiceLinks !== false) E("worker pod has service links on (TULIP_* variables would be read as flags)");
  if (tf.attach !== "true") E("tulip is not started with --attach (rose runs as a sidecar)");
  if ("rose-bin" in tf) E("tulip has --rose-bin and would spawn a second rose");
  if (wPod.shareProcessNamespace !== true) E("worker pod lacks shareProcessNamespace: true (tulip --attach checks rose's pid)");
  for (const f of ["depth", "max-batch-tokens"]) {
    const t = tf[f] ?? help.tulip.flags[f], r = rf[f] ?? help.rose.flags[f];
    if (t !== r) E(`tulip --${f}=${t} and rose --${f}=${r} differ (rose sizes the channel tulip attaches to)`);
  }
  if (rf["create-shm"] !== "true") E("rose is not started with --create-shm");
  if (!tf["shm-name"] || tf["shm-name"] !== rf["shm-name"]) E(`tulip --shm-name=${tf["shm-name"]} and rose --shm-name=${rf["shm-name"]} differ`);
  if (!tf.model || tf.model !== rf.model) E(`tulip --model=${tf.model} and rose --model=${rf.model} differ`);
  if (tf.device !== rf.device) E(`tulip --device=${tf.device} and rose --device=${rf.device} differ`);

  // No back door through tulip [TAG_TULIP_TOKEN].
  if (tf.host !== "0.0.0.0") {
    E(`tulip --host=${tf.host ?? "(default 127.0.0.1)"}: ivy, the probes and Prometheus reach tulip at the pod's address (--host=0.0.0.0)`);
  }
  // The Secret key behind a token flag ("secret/key"), or null (reported) when it is not one.
  const tokenSecret = (c, pod, flag, flags) => {
    const path = flags[flag];
    if (!path) { E(`${c.name} has no --${flag} (tulip must require the shared token, ivy present it)`); return null; }
    const vm = (c.volumeMounts ?? []).find((m) => path.startsWith(m.mountPath.replace(/\/$/, "") + "/"));
    const vol = vm && (pod.volumes ?? []).find((v) => v.name === vm.name);
    if (!vol?.secret?.secretName) { E(`${c.name} --${flag}=${path} is not a file of a Secret volume`); return null; }
    if (!vm.readOnly) E(`${c.name} mounts the token Secret read-write`);
    const file = path.slice(vm.mountPath.replace(/\/$/, "").length + 1);
    const key = vol.secret.items ? vol.secret.items.find((i) => i.path === file)?.key : file;
    if (!key || key.includes("/")) { E(`${c.name} --${flag}: ${file} is not a key of Secret ${vol.secret.secretName}`); return null; }
    return `${vol.secret.secretName}/${key}`;
  };
  const tulipToken = tokenSecret(tulip, wPod, "auth-token-file", tf);
  const ivyToken = tokenSecret(ivy, ivyPod, "tulip-token-file", ivyFlags);
  if (tulipToken && ivyToken && tulipToken !== ivyToken) E(`ivy presents ${ivyToken}, tulip accepts ${tulipToken}`);
  const ivyLabels = ivyDep.spec.template.metadata.labels;
  const policies = objs.filter((o) => o.kind === "NetworkPolicy" && matches(o.spec.podSelector?.matchLabels, wLabels) &&
    (o.spec.policyTypes ?? ["Ingress"]).includes("Ingress"));
  if (!policies.length) E("no NetworkPolicy selects the worker pods for ingress (every pod could call tulip)");
  const covers = (rule, name, number) => !(rule.ports ?? []).length ||
    rule.ports.some((p) => p.port === undefined || p.port === name || Number(p.port) === number);
  let ivyReachesGrpc = false, metricsReachable = false;
  for (const np of policies) {
    for (const rule of np.spec.ingress ?? []) {
      const from = rule.from ?? [];
      if (covers(rule, "grpc", grpcPort)) {
        const onlyIvy = from.length > 0 && from.every((peer) => peer.podSelector && !peer.namespaceSelector &&
          !peer.ipBlock && matches(peer.podSelector.matchLabels, ivyLabels) && !matches(peer.podSelector.matchLabels, wLabels));
        if (onlyIvy) ivyReachesGrpc = true;
        else E(`NetworkPolicy ${np.metadata.name} lets more than ivy's pods reach tulip's gRPC port`);
      }
      if (covers(rule, "metrics", metricsPort) && from.length) metricsReachable = true;
    }
  }
  if (policies.length && !ivyReachesGrpc) E("no NetworkPolicy rule lets ivy reach tulip's gRPC port");
  if (policies.length && !metricsReachable) E("no NetworkPolicy rule lets a scraper reach tulip's metrics port");

  // shared memory
  const shmMounts = [tulip, rose].map((c) => (c.volumeMounts ?? []).find((m) => m.mountPath === "/dev/shm"));
  if (!shmMounts[0] || !shmMounts[1]) E(`/dev/shm is not mounted in ${!shmMounts[0] ? "tulip" : "rose"}`);
  else if (shmMounts[0].name !== shmMounts[1].name) E(`tulip and rose mount different volumes at /dev/shm (${shmMounts[0].name}, ${shmMounts[1].name})`);
  else {
    const vol = (wPod.volumes ?? []).find((v) => v.name === shmMounts[0].name);
    if (vol?.emptyDir?.medium !== "Memory") E(`/dev/shm volume ${shmMounts[0].name} is not an emptyDir with medium: Memory`);
    if (shmMounts.some((m) => m.readOnly)) E("/dev/shm mounted read-only");
  }
  const uidOf = (c) => c.securityContext?.runAsUser ?? wPod.securityContext?.runAsUser;
  if (uidOf(tulip) !== uidOf(rose)) E("tulip and rose run as different uids (the shm segment is 0600)");

  // GPUs
  const gpus = EXPECTED_GPUS[overlay];
  const rg = rose.resources ?? {};
  if (Number(rg.limits?.["nvidia.com/gpu"]) !== gpus || Number(rg.requests?.["nvidia.com/gpu"] ?? rg.limits?.["nvidia.com/gpu"]) !== gpus) {
    E(`rose should request and limit nvidia.com/gpu: ${gpus}, has ${JSON.stringify(rg)}`);
  }
  if (tulip.resources?.limits?.["nvidia.com/gpu"] || tulip.resources?.requests?.["nvidia.com/gpu"]) E("tulip requests a GPU");
  if (rf.device !== "cuda") E(`rose --device=${rf.device} on a GPU worker`);
  for (const c of [tulip, rose]) checkContainerSecurity(wPod, c, `${overlay}: ${c.name}`, errors);

  // drain
  const tulipDrain = Number(tf["drain-timeout-ms"] ?? help.tulip.flags["drain-timeout-ms"] ?? NaN) / 1000;
  if (!(tulipDrain > 0)) E("tulip's drain time is unknown (no --drain-timeout-ms)");
  const wGrace = wPod.terminationGracePeriodSeconds ?? 30;
  if (!(preStopSleep(tulip) > 0)) E("tulip has no preStop sleep (DNS must drop the pod before SIGTERM)");
  if (wGrace < preStopSleep(tulip) + tulipDrain) E(`worker terminationGracePeriodSeconds ${wGrace} < preStop ${preStopSleep(tulip)} + drain ${tulipDrain}`);

  // headless Service and ivy's DNS target
  if (headless.spec.clusterIP !== "None") E("tulip-headless is not headless (clusterIP: None)");
  if (headless.spec.publishNotReadyAddresses) E("tulip-headless publishes not-ready pods to ivy");
  if (!matches(headless.spec.selector, wLabels)) E("tulip-headless does not select the worker pods");
  // ivy's --tulip-dns (periodic re-resolution) when the binary has it, else --tulip NAME:PORT.
  const dnsFlag = "tulip-dns" in help.ivy.flags ? "tulip-dns" : "tulip";
  const other = dnsFlag === "tulip" ? "tulip-dns" : "tulip";
  if (other in ivyFlags) E(`ivy has --${other}; with this ivy use only --${dnsFlag}`);
  const dns = ivyFlags[dnsFlag];
  const m = dns?.match(/^([a-z0-9.-]+):(\d+)$/);
  if (!m) E(`ivy --${dnsFlag}=${dns} is not NAME:PORT`);
  else {
    const host = m[1].split(".");
    const ns = objs.find((o) => o.metadata?.namespace)?.metadata.namespace;
    if (host[0] !== headless.metadata.name || (host.length > 1 && host[1] !== ns)) {
      E(`ivy --${dnsFlag} host ${m[1]} is not the headless Service ${headless.metadata.name}`);
    }
    const sp = headless.spec.ports.find((p) => p.port === Number(m[2]));
    if (!sp) E(`tulip-headless has no port ${m[2]} (ivy --${dnsFlag})`);
    else if (portByName(tulip, sp.targetPort) !== grpcPort) E(`tulip-headless port ${m[2]} does not target tulip's gRPC port`);
  }

  // weights
  for (const [c, pod] of [[ivy, ivyPod], [tulip, wPod], [rose, wPod]]) {
    const vm = (c.volumeMounts ?? []).find((v) => (pod.volumes ?? []).find((x) => x.name === v.name)?.persistentVolumeClaim);
    if (!vm) { E(`${c.name} does not mount the weights volume`); continue; }
    const vol = pod.volumes.find((x) => x.name === vm.name);
    if (vol.persistentVolumeClaim.claimName !== pvc?.metadata.name) E(`${c.name} mounts claim ${vol.persistentVolumeClaim.claimName}, not ${pvc?.metadata.name}`);
    if (!vm.readOnly) E(`${c.name} mounts the weights read-write`);
    const path = c === ivy ? (ivyFlags["model-dir"] ?? ivyFlags.tokenizer) : (c === tulip ? tf.model : rf.model);
    if (!path?.startsWith(vm.mountPath + "/") || path.includes("/unset")) E(`${c.name} reads ${path}, not a model folder under ${vm.mountPath}`);
  }

  // PDBs, HPAs, ServiceMonitors
  for (const [dep, podLabels] of [[ivyDep, ivyDep.spec.template.metadata.labels], [workerDep, wLabels]]) {
    const pdb = objs.find((o) => o.kind === "PodDisruptionBudget" && matches(o.spec.selector?.matchLabels, podLabels));
    if (!pdb) E(`no PodDisruptionBudget selects the ${dep.metadata.name} pods`);
  }
  for (const hpa of objs.filter((o) => o.kind === "HorizontalPodAutoscaler")) {
    const t = hpa.spec.scaleTargetRef;
    if (!find(objs, t.kind, t.name)) E(`HPA ${hpa.metadata.name} targets missing ${t.kind}/${t.name}`);
  }
  // Custom metrics an HPA scales on must be metrics tulip exports: its binary holds their names.
  for (const hpa of objs.filter((o) => o.kind === "HorizontalPodAutoscaler")) {
    for (const x of hpa.spec.metrics ?? []) {
      const name = x.pods?.metric?.name ?? x.object?.metric?.name;
      if (!name) continue;
      if (!help.tulip.binary) { console.log(`note: HPA metric ${name} not checked (tulip not built)`); continue; }
      if (!help.tulip.binary.includes(Buffer.from(name))) E(`HPA ${hpa.metadata.name} scales on ${name}, which tulip does not export`);
    }
  }
  const ivyHpa = objs.find((o) => o.kind === "HorizontalPodAutoscaler" && o.spec.scaleTargetRef.name === "ivy");
  if (!ivyHpa?.spec.metrics?.some((x) => x.type === "Resource" && x.resource?.name === "cpu")) E("no CPU HPA for ivy");
  for (const sm of objs.filter((o) => o.kind === "ServiceMonitor")) {
    const svcs = objs.filter((o) => o.kind === "Service" && matches(sm.spec.selector?.matchLabels, o.metadata.labels));
    if (!svcs.length) { E(`ServiceMonitor ${sm.metadata.name} selects no Service`); continue; }
    for (const ep of sm.spec.endpoints) {
      for (const s of svcs) {
        const sp = s.spec.ports.find((p) => p.name === ep.port);
        if (!sp) E(`ServiceMonitor ${sm.metadata.name}: Service ${s.metadata.name} has no port ${ep.port}`);
        else if (ep.path !== "/metrics") E(`ServiceMonitor ${sm.metadata.name} scrapes ${ep.path}`);
      }
    }
  }
  const monitored = (name) => objs.some((o) => o.kind === "ServiceMonitor" &&
    objs.some((s) => s.kind === "Service" && s.metadata.name === name && matches(o.spec.selector?.matchLabels, s.metadata.labels) &&
      o.spec.endpoints.some((ep) => s.spec.ports.some((p) => p.name === ep.port &&
        portByName(name === "ivy" ? ivy : tulip, p.targetPort) === (name === "ivy" ? ivyPort : metricsPort)))));
  if (!monitored("ivy")) E("no ServiceMonitor scrapes ivy's /metrics port");
  if (!monitored("tulip-headless")) E("no ServiceMonitor scrapes tulip's metrics port");

  // Dockerfiles: images hold the binaries at the paths used, as the same uid, exposing the ports.
  if (dockerfiles) {
    const check = (df, name, c, ports, pod) => {
      const text = dockerfiles[df];
      const bin = c.command?.[0] ?? text.match(/ENTRYPOINT \["([^"]+)"/)?.[1];
      if (!bin || !text.includes(bin)) E(`${name}: ${bin} is not installed by deploy/docker/${df}`);
      const user = text.match(/^USER (\d+)/m)?.[1];
      if (Number(user) !== (c.securityContext?.runAsUser ?? pod.securityContext?.runAsUser)) E(`${name}: ${df} USER ${user} differs from runAsUser`);
      for (const p of ports) if (!new RegExp(`^EXPOSE .*\\b${p}\\b`, "m").test(text)) E(`${name}: ${df} does not EXPOSE ${p}`);
      // The binaries bind 127.0.0.1 unless told otherwise: the image's command must say 0.0.0.0.
      if (ports.length && !/^CMD \[.*"--host=0\.0\.0\.0"/m.test(text)) E(`${name}: ${df}'s CMD does not give --host=0.0.0.0`);
    };
    check("ivy.Dockerfile", "ivy", ivy, [ivyPort], ivyPod);
    check("worker.Dockerfile", "tulip", tulip, [grpcPort, metricsPort], wPod);
    check("worker.Dockerfile", "rose", rose, [], wPod);
  }
  return errors;
}

// ---- self-test: each known-bad edit must be caught ----------------------------------------

const MUTATIONS = [
  ["ivy readiness probe on /health", (o) => { dep(o, "ivy").containers[0].readinessProbe.httpGet.path = "/health"; }, /readinessProbe path/],
  ["ivy probe on another port", (o) => { dep(o, "ivy").containers[0].livenessProbe.httpGet.port = 9999; }, /livenessProbe port/],
  ["ivy --port differs from containerPort", (o) => { setArg(dep(o, "ivy").containers[0], "port", "8081"); }, /ivy --port=8081/],
  ["unknown ivy flag", (o) => { dep(o, "ivy").containers[0].args.push("--bogus-flag=1"); }, /--bogus-flag is not a ivy flag/],
  ["unresolved $(VAR)", (o) => { setArg(dep(o, "ivy").containers[0], "threads", "$(NOPE)"); }, /\$\(NOPE\)/],
  ["tulip grpc probe on the metrics port", (o) => { tulipOf(o).readinessProbe.grpc.port = 9091; }, /readinessProbe grpc port/],
  ["tulip liveness following rose", (o) => { tulipOf(o).livenessProbe = { grpc: { port: 50051, service: "" } }; }, /livenessProbe is not an HTTP probe/],
  ["tulip liveness on /health", (o) => { tulipOf(o).livenessProbe.httpGet.path = "/health"; }, /livenessProbe path \/health/],
  ["no shared pid namespace", (o) => { delete dep(o, "garden-worker").shareProcessNamespace; }, /shareProcessNamespace/],
  ["service links on", (o) => { dep(o, "ivy").enableServiceLinks = true; }, /service links/],
  ["rose sized differently", (o) => { setArg(roseOf(o), "depth", "8"); }, /--depth=.* differ/],
  ["tulip without /dev/shm", (o) => { const t = tulipOf(o); t.volumeMounts = t.volumeMounts.filter((m) => m.mountPath !== "/dev/shm"); }, /\/dev\/shm is not mounted in tulip/],
  ["shm on disk", (o) => { dep(o, "garden-worker").volumes.find((v) => v.name === "shm").emptyDir = {}; }, /medium: Memory/],
  ["different shm names", (o) => { setArg(roseOf(o), "shm-name", "other"); }, /--shm-name=.* differ/],
  ["ivy DNS name not the headless Service", (o) => { const c = dep(o, "ivy").containers[0]; setArg(c, c.args.some((a) => a.startsWith("--tulip-dns")) ? "tulip-dns" : "tulip", "tulip:50051"); }, /not the headless Service/],
  ["headless Service selects nothing", (o) => { svc(o, "tulip-headless").spec.selector = { app: "nope" }; }, /does not select the worker pods/],
  ["Service with a cluster IP", (o) => { delete svc(o, "tulip-headless").spec.clusterIP; }, /not headless/],
  ["no GPU for rose", (o) => { delete roseOf(o).resources.limits["nvidia.com/gpu"]; }, /nvidia.com\/gpu/],
  ["writable root filesystem", (o) => { tulipOf(o).securityContext.readOnlyRootFilesystem = false; }, /readOnlyRootFilesystem/],
  ["capabilities kept", (o) => { delete roseOf(o).securityContext.capabilities; }, /drop ALL/],
  ["grace shorter than the drain", (o) => { dep(o, "garden-worker").terminationGracePeriodSeconds = 10; }, /terminationGracePeriodSeconds 10/],
  ["ivy grace shorter than the drain", (o) => { dep(o, "ivy").terminationGracePeriodSeconds = 15; }, /ivy terminationGracePeriodSeconds 15/],
  ["ServiceMonitor on a missing port", (o) => { o.find((x) => x.kind === "ServiceMonitor" && x.metadata.name === "ivy").spec.endpoints[0].port = "web"; }, /has no port web/],
  ["HPA on a metric tulip does not export", (o) => { const h = o.find((x) => x.kind === "HorizontalPodAutoscaler" && x.metadata.name === "garden-worker"); if (h && selfTestHasTulip) h.spec.metrics[0].pods.metric.name = "tulip_no_such_metric"; else throw new Skip(); }, /does not export/],
  ["rose sidecar that must exit first", (o) => { delete roseOf(o).restartPolicy; }, /restartPolicy: Always/],
  ["tulip on loopback only", (o) => { setArg(tulipOf(o), "host", "127.0.0.1"); }, /tulip --host=127.0.0.1/],
  ["tulip without a token", (o) => { const t = tulipOf(o); t.args = t.args.filter((a) => !a.startsWith("--auth-token-file")); }, /tulip has no --auth-token-file/],
  ["ivy presenting another Secret", (o) => { dep(o, "ivy").volumes.find((v) => v.name === "tulip-token").secret.secretName = "other"; }, /ivy presents other\/token, tulip accepts/],
  ["token file outside the Secret volume", (o) => { setArg(tulipOf(o), "auth-token-file", "/tmp/token"); }, /is not a file of a Secret volume/],
  ["no NetworkPolicy", (o) => { o.splice(o.findIndex((x) => x.kind === "NetworkPolicy"), 1); }, /no NetworkPolicy selects the worker pods/],
  ["gRPC port open to every pod", (o) => { netpol(o).spec.ingress[0].from = [{ podSelector: {} }]; }, /lets more than ivy's pods reach tulip's gRPC port/],
  ["gRPC port open to ivy in any namespace", (o) => { netpol(o).spec.ingress[0].from[0].namespaceSelector = {}; }, /lets more than ivy's pods/],
  ["scraper rule without ports", (o) => { delete netpol(o).spec.ingress[1].ports; }, /lets more than ivy's pods/],
  ["metrics port closed", (o) => { netpol(o).spec.ingress.pop(); }, /lets a scraper reach tulip's metrics port/],
];
class Skip extends Error {}
let selfTestHasTulip = false;
const dep = (o, n) => o.find((x) => x.kind === "Deployment" && x.metadata.name === n).spec.template.spec;
const svc = (o, n) => o.find((x) => x.kind === "Service" && x.metadata.name === n);
const netpol = (o) => o.find((x) => x.kind === "NetworkPolicy" && x.metadata.name === "garden-worker");
const tulipOf = (o) => dep(o, "garden-worker").containers.find((c) => c.name === "tulip");
const roseOf = (o) => [...(dep(o, "garden-worker").initContainers ?? []), ...dep(o, "garden-worker").containers].find((c) => c.name === "rose");
function setArg(c, flag, value) {
  const i = c.args.findIndex((a) => a.startsWith(`--${flag}=`) || a === `--${flag}`);
  if (i < 0) throw new Error(`self-test: no --${flag} to edit`);
  c.args[i] = `--${flag}=${value}`;
}

// ---- main ---------------------------------------------------------------------------------

const help = {
  ivy: loadFlags("ivy", args.ivy),
  tulip: loadFlags("tulip", args.tulip),
  rose: loadFlags("rose", args.rose),
};
for (const [n, h] of Object.entries(help)) console.log(`flags of ${n}: ${h.source}`);
selfTestHasTulip = Boolean(help.tulip.binary);
const dockerfiles = {
  "ivy.Dockerfile": readFileSync(join(repo, "deploy/docker/ivy.Dockerfile"), "utf8"),
  "worker.Dockerfile": readFileSync(join(repo, "deploy/docker/worker.Dockerfile"), "utf8"),
};

let failed = 0, passed = 0;
for (const overlay of Object.keys(EXPECTED_GPUS)) {
  const objs = loadRendered(args.rendered, overlay);
  const errors = checkOverlay(overlay, objs, help, dockerfiles);
  if (errors.length) { failed++; for (const e of errors) console.log(`FAIL ${e}`); }
  else { passed++; console.log(`ok   ${overlay}: wiring checks passed (${objs.length} objects)`); }

  if (args.selfTest && overlay === "embeddings") {
    for (const [what, mutate, expect] of MUTATIONS) {
      const copy = structuredClone(objs);
      try { mutate(copy); } catch (e) {
        if (!(e instanceof Skip)) throw e;
        console.log(`note: self-test '${what}' needs the tulip binary; not run`);
        continue;
      }
      const errs = checkOverlay(overlay, copy, help, dockerfiles);
      if (errs.some((e) => expect.test(e))) { passed++; console.log(`ok   self-test caught: ${what}`); }
      else { failed++; console.log(`FAIL self-test missed: ${what} (got: ${errs.join(" | ") || "no error"})`); }
    }
  }
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
