// The official `openai` npm client (a real client nobody here wrote; version pinned in
// package.json, installed by install.sh) against the three real binaries on CPU:
//   * an embedding mesh: ivy -> tulip -> rose on the tiny random Qwen3 that rose-mkmodel writes;
//   * a chat mesh: ivy -> tulip -> rose on a tiny random gpt-oss (rose-mkmodel --kind gpt-oss)
//     with the real o200k_harmony tokenizer: chat, completions and /v1/responses
//     (client.responses.create, streamed events, client.responses.stream; 4.104.0 has them;
//     text.format json_schema constrains the answer).
// Every case asserts on what the client returns: shapes, ids, finish_reason, usage, errors, and
// that streamed chunks assemble to the non-streaming answer under greedy decoding with a fixed
// seed (the weights are random, so the text is gibberish; equality is what is checked).
//
//   node openai_client_test.mjs --build BUILD_DIR --modules NPM_DIR --tokenizer GPTOSS_JSON
//                               --source SOURCE_DIR [--keep] [--device cpu|cuda]
// --device cuda runs both meshes' rose on the GPU (the CUDA backend; gpu_llm.sh step oai).
// Exit status 0 when every case passed; the binaries' logs are printed when one failed.
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import { createRequire } from 'node:module';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';

const args = {};
for (let i = 2; i < process.argv.length; i++) {
  const a = process.argv[i];
  if (!a.startsWith('--')) throw new Error(`unexpected argument ${a}`);
  const next = process.argv[i + 1];
  if (next === undefined || next.startsWith('--')) args[a.slice(2)] = true;
  else args[a.slice(2)] = process.argv[++i];
}
for (const k of ['build', 'modules', 'tokenizer', 'source']) {
  if (!args[k]) throw new Error(`--${k} is required`);
}
const bin = (rel) => path.join(args.build, rel);
const require = createRequire(path.join(args.modules, 'package.json'));
const OpenAI = require('openai');
const clientVersion = JSON.parse(fs.readFileSync(
  path.join(args.modules, 'node_modules', 'openai', 'package.json'), 'utf8')).version;

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'garden-openai-'));
const procs = [];

function log(msg) {
  process.stdout.write(`${msg}\n`);
}

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.unref();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

function start(name, argv) {
  const logPath = path.join(tmp, `${name}.log`);
  const out = fs.openSync(logPath, 'w');
  const child = spawn(argv[0], argv.slice(1), { stdio: ['ignore', out, out] });
  fs.closeSync(out);
  const p = { name, child, logPath, exited: null };
  child.on('exit', (code, signal) => {
    p.exited = { code, signal };
  });
  procs.push(p);
  return p;
}

function runOrThrow(name, argv) {
  const r = spawnSync(argv[0], argv.slice(1), { encoding: 'utf8', timeout: 300_000 });
  fs.writeFileSync(path.join(tmp, `${name}.log`), `${r.stdout ?? ''}${r.stderr ?? ''}`);
  if (r.status !== 0) {
    throw new Error(`${argv.join(' ')} failed (${r.status ?? r.signal}):\n${r.stdout}${r.stderr}`);
  }
}

async function waitReady(port, procsOfMesh, limitMs) {
  const deadline = Date.now() + limitMs;
  while (Date.now() < deadline) {
    for (const p of procsOfMesh) {
      if (p.exited) throw new Error(`${p.name} exited early (${JSON.stringify(p.exited)})`);
    }
    try {
      const r = await fetch(`http://127.0.0.1:${port}/ready`);
      if (r.status === 200) return;
    } catch {
      // not listening yet
    }
    await new Promise((r) => setTimeout(r, 250));
  }
  throw new Error(`ivy on :${port} not ready after ${limitMs} ms`);
}

async function startMesh(name, modelDir, tokenizer, served) {
  const tulipPort = await freePort();
  const ivyPort = await freePort();
  const tulip = start(`${name}-tulip`, [
    bin('services/tulip/tulip'), '--host', '127.0.0.1', '--port', String(tulipPort),
    '--metrics-port', '0', '--model', modelDir, '--device', args.device || 'cpu',
    '--rose-bin', bin('services/rose/rose'), '--rose-threads', '2',
    '--shm-name', `/garden-oai-${process.pid}-${tulipPort}`, '--served-model-name', served,
    '--heartbeat-timeout-ms', '5000',
  ]);
  const ivy = start(`${name}-ivy`, [
    bin('services/ivy/ivy'), '--host', '127.0.0.1', '--port', String(ivyPort),
    '--tulip', `127.0.0.1:${tulipPort}`, '--tokenizer', tokenizer, '--threads', '2',
  ]);
  await waitReady(ivyPort, [tulip, ivy], 180_000);
  return { port: ivyPort, served };
}

async function stopAll() {
  for (const p of procs) if (!p.exited) p.child.kill('SIGTERM');
  const deadline = Date.now() + 10_000;
  while (procs.some((p) => !p.exited) && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 100));
  }
  for (const p of procs) if (!p.exited) p.child.kill('SIGKILL');
}

// ---- tiny test runner -------------------------------------------------------------------------
const cases = [];
const test = (name, fn) => cases.push({ name, fn });

// ---- helpers -----------------------------------------------------------------------------------
const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));

async function expectApiError(promise, status, param) {
  let err = null;
  try {
    await promise;
  } catch (e) {
    err = e;
  }
  assert.ok(err, `expected an HTTP ${status} error`);
  assert.ok(err instanceof OpenAI.APIError, `expected an APIError, got ${err}`);
  assert.equal(err.status, status, `status of: ${err.message}`);
  if (param !== undefined) assert.equal(err.param, param, `param of: ${err.message}`);
  assert.equal(typeof err.message, 'string');
  assert.ok(err.message.length > 0);
  return err;
}

// Assembles streamed chat chunks the way a caller would: text fields concatenated, tool call
// fragments merged by index (id/name from the first fragment, arguments appended). Checks the
// chunk-level invariants on the way.
function assembleChat(chunks, model) {
  assert.ok(chunks.length >= 2, 'a stream has at least a role chunk and a finish chunk');
  const id = chunks[0].id;
  const created = chunks[0].created;
  const out = { role: null, content: '', reasoning_content: '', tool_calls: [], finish_reason: null,
    usage: null, finishChunks: 0 };
  for (const c of chunks) {
    assert.equal(c.object, 'chat.completion.chunk');
    assert.equal(c.id, id, 'every chunk carries the same id');
    assert.equal(c.created, created, 'every chunk carries the same created');
    assert.equal(c.model, model);
    if (c.usage) {
      assert.equal(out.usage, null, 'one usage chunk');
      assert.deepEqual(c.choices, [], 'the usage chunk has no choices');
      out.usage = c.usage;
      continue;
    }
    assert.equal(c.choices.length, 1);
    const ch = c.choices[0];
    assert.equal(ch.index, 0);
    assert.equal(out.usage, null, 'nothing after the usage chunk');
    if (ch.finish_reason) {
      out.finishChunks++;
      out.finish_reason = ch.finish_reason;
    } else {
      assert.equal(out.finish_reason, null, 'no text after the finish_reason');
    }
    const d = ch.delta ?? {};
    if (d.role) {
      assert.equal(out.role, null, 'role is sent once');
      out.role = d.role;
    }
    if (typeof d.content === 'string') out.content += d.content;
    if (typeof d.reasoning_content === 'string') out.reasoning_content += d.reasoning_content;
    for (const t of d.tool_calls ?? []) {
      assert.equal(typeof t.index, 'number');
      if (!out.tool_calls[t.index]) {
        assert.equal(typeof t.id, 'string', 'the first fragment of a call has its id');
        assert.equal(t.type, 'function');
        assert.equal(typeof t.function?.name, 'string', 'the first fragment names the function');
        out.tool_calls[t.index] = { id: t.id, type: 'function',
          function: { name: t.function.name, arguments: '' } };
      }
      if (t.function?.arguments) out.tool_calls[t.index].function.arguments += t.function.arguments;
    }
  }
  assert.equal(out.finishChunks, 1, 'exactly one chunk carries finish_reason');
  assert.equal(out.role, 'assistant');
  return { id, created, ...out };
}

// Usage without prompt_tokens_details: cached_tokens depends on what the prefix cache held when
// the request came (the second of two equal requests finds the first one's blocks).
const counts = (u) => ({ prompt_tokens: u.prompt_tokens, completion_tokens: u.completion_tokens,
  total_tokens: u.total_tokens });

function checkUsage(u, maxTokens, finish) {
  assert.equal(typeof u.prompt_tokens, 'number');
  assert.equal(typeof u.completion_tokens, 'number');
  assert.ok(u.prompt_tokens > 0);
  assert.ok(u.completion_tokens > 0 && u.completion_tokens <= maxTokens,
    `completion_tokens ${u.completion_tokens} within (0, ${maxTokens}]`);
  assert.equal(u.total_tokens, u.prompt_tokens + u.completion_tokens);
  const cached = u.prompt_tokens_details?.cached_tokens ?? 0;
  assert.ok(cached >= 0 && cached <= u.prompt_tokens, `cached_tokens ${cached}`);
  if (finish === 'length') assert.equal(u.completion_tokens, maxTokens);
}

// The Harmony prompt's token count for a chat, from ivy's /tokenize (an independent path through
// the same renderer and tokenizer).
async function promptTokens(port, body) {
  const r = await fetch(`http://127.0.0.1:${port}/tokenize`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  assert.equal(r.status, 200, await r.clone().text());
  return (await r.json()).count;
}

// ---- the meshes --------------------------------------------------------------------------------
let emb; // { port, served, client }
let chat;

async function setup() {
  log(`openai ${clientVersion} on node ${process.version}; rose on ${args.device || 'cpu'}; ` +
      `work dir ${tmp}`);
  const embDir = path.join(tmp, 'embed');
  runOrThrow('mkmodel-embed', [bin('services/rose/rose-mkmodel'), '--out', embDir,
    '--repo', args.source]);
  const chatDir = path.join(tmp, 'chat');
  runOrThrow('mkmodel-chat', [bin('services/rose/rose-mkmodel'), '--kind', 'gpt-oss',
    '--out', chatDir, '--tokenizer-json', args.tokenizer]);
  const [e, c] = await Promise.all([
    startMesh('embed', embDir, path.join(embDir, 'tokenizer.model'), 'tiny-embed'),
    startMesh('chat', chatDir, path.join(chatDir, 'tokenizer.json'), 'tiny-gpt-oss'),
  ]);
  const client = (port) => new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'unused',
    maxRetries: 0, timeout: 120_000 });
  emb = { ...e, client: client(e.port) };
  chat = { ...c, client: client(c.port) };
}

// ---- embeddings --------------------------------------------------------------------------------
test('models.list names the served model', async () => {
  for (const m of [emb, chat]) {
    const page = await m.client.models.list();
    const ids = page.data.map((x) => x.id);
    assert.deepEqual(ids, [m.served]);
    assert.equal(page.data[0].object, 'model');
  }
});

test('embeddings: floats and the client default (base64, decoded by the client) agree', async () => {
  const input = ['hello garden', 'a second text'];
  const f = await emb.client.embeddings.create({ model: emb.served, input,
    encoding_format: 'float' });
  assert.equal(f.object, 'list');
  assert.equal(f.model, emb.served);
  assert.equal(f.data.length, 2);
  f.data.forEach((d, i) => {
    assert.equal(d.object, 'embedding');
    assert.equal(d.index, i);
    assert.ok(Array.isArray(d.embedding) && d.embedding.length > 0);
    assert.ok(Math.abs(norm(d.embedding) - 1) < 1e-3, 'L2-normalized');
  });
  assert.notDeepEqual(f.data[0].embedding, f.data[1].embedding);
  assert.ok(f.usage.prompt_tokens >= 2);
  assert.equal(f.usage.total_tokens, f.usage.prompt_tokens);
  // No encoding_format: this client asks for base64 and decodes the little-endian float32 bytes.
  const b = await emb.client.embeddings.create({ model: emb.served, input });
  assert.equal(b.data.length, 2);
  for (let i = 0; i < 2; i++) {
    const want = f.data[i].embedding.map(Math.fround);
    assert.deepEqual(Array.from(b.data[i].embedding), want, 'base64 float32 == float text');
  }
  assert.deepEqual(b.usage, f.usage);
});

test('embeddings: dimensions truncates and renormalizes; token-id input', async () => {
  const r = await emb.client.embeddings.create({ model: emb.served, input: 'hello garden',
    dimensions: 16, encoding_format: 'float' });
  assert.equal(r.data.length, 1);
  assert.equal(r.data[0].embedding.length, 16);
  assert.ok(Math.abs(norm(r.data[0].embedding) - 1) < 1e-3);
  const ids = await emb.client.embeddings.create({ model: emb.served, input: [[12, 7, 99]],
    encoding_format: 'float' });
  assert.equal(ids.usage.prompt_tokens, 3);
});

test('embeddings: errors reach the client as APIError with status and param', async () => {
  const nf = await expectApiError(emb.client.embeddings.create({ model: 'no-such-model',
    input: 'x' }), 404, 'model');
  assert.ok(nf instanceof OpenAI.NotFoundError);
  assert.match(nf.message, /no-such-model/);
  const bad = await expectApiError(emb.client.embeddings.create({ model: emb.served, input: [] }),
    400, 'input');
  assert.ok(bad instanceof OpenAI.BadRequestError);
});

// ---- chat ---------------------------------------------------------------------------------------
const MESSAGES = [
  { role: 'system', content: 'You are a terse assistant.' },
  { role: 'user', content: 'Name three colours of a garden.' },
];
const GREEDY = { temperature: 0, seed: 7 };

function checkCompletion(r, maxTokens) {
  assert.equal(r.object, 'chat.completion');
  assert.equal(typeof r.id, 'string');
  assert.ok(r.id.length > 0);
  assert.ok(Number.isInteger(r.created));
  assert.ok(Math.abs(r.created - Date.now() / 1000) < 600, 'created is a unix time in seconds');
  assert.equal(r.model, chat.served);
  assert.equal(r.choices.length, 1);
  const c = r.choices[0];
  assert.equal(c.index, 0);
  assert.equal(c.message.role, 'assistant');
  assert.ok(['stop', 'length', 'tool_calls'].includes(c.finish_reason), c.finish_reason);
  checkUsage(r.usage, maxTokens, c.finish_reason);
  return c;
}

test('chat: non-streaming answer has the OpenAI shape and honest usage', async () => {
  const maxTokens = 12;
  const r = await chat.client.chat.completions.create({ model: chat.served, messages: MESSAGES,
    max_tokens: maxTokens, ...GREEDY });
  const c = checkCompletion(r, maxTokens);
  const text = (c.message.content ?? '') + (c.message.reasoning_content ?? '');
  assert.ok(text.length > 0, 'the model said something (content or reasoning_content)');
  assert.ok(!c.message.tool_calls || c.message.tool_calls.length === 0);
  // usage.prompt_tokens is the Harmony prompt of exactly these messages.
  assert.equal(r.usage.prompt_tokens, await promptTokens(chat.port, { messages: MESSAGES }));
  // Another request gets another id.
  const again = await chat.client.chat.completions.create({ model: chat.served,
    messages: MESSAGES, max_tokens: maxTokens, ...GREEDY });
  assert.notEqual(again.id, r.id);
  assert.deepEqual(again.choices[0].message, c.message, 'greedy decoding is deterministic');
});

test('chat: streamed chunks assemble to the non-streaming answer (greedy, fixed seed)', async () => {
  // 264 tokens: a random model never closes its Harmony header, and ivy's lenient parser holds
  // up to 256 header tokens before treating the rest as content (max_header_tokens), so the
  // tokens after that arrive as separate deltas: a real multi-chunk stream.
  const maxTokens = 264;
  const body = { model: chat.served, messages: MESSAGES, max_tokens: maxTokens, ...GREEDY };
  const whole = await chat.client.chat.completions.create(body);
  const c = checkCompletion(whole, maxTokens);
  const stream = await chat.client.chat.completions.create({ ...body, stream: true,
    stream_options: { include_usage: true } });
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  const a = assembleChat(chunks, chat.served);
  assert.notEqual(a.id, whole.id);
  assert.equal(a.content, c.message.content ?? '');
  assert.equal(a.reasoning_content, c.message.reasoning_content ?? '');
  assert.ok(a.content.length + a.reasoning_content.length > 0);
  assert.equal(a.finish_reason, c.finish_reason);
  assert.deepEqual(counts(a.usage), counts(whole.usage),
    'the usage chunk counts equal the non-streaming usage');
  const textDeltas = chunks.filter((k) => k.choices[0]?.delta?.reasoning_content ||
    k.choices[0]?.delta?.content).length;
  assert.ok(textDeltas >= 4, `the text arrived in ${textDeltas} deltas`);
});

test('chat: the client\'s stream helper and a stream without usage agree with the whole', async () => {
  const maxTokens = 24;
  const body = { model: chat.served, messages: MESSAGES, max_tokens: maxTokens, ...GREEDY };
  const whole = await chat.client.chat.completions.create(body);
  const c = checkCompletion(whole, maxTokens);
  // The client's own stream helper accumulates content and validates role/finish_reason (it
  // overwrites unknown delta fields such as reasoning_content instead of appending, so that one
  // is assembled here).
  const helper = chat.client.beta.chat.completions.stream(body);
  let reasoning = '';
  helper.on('chunk', (k) => { reasoning += k.choices[0]?.delta?.reasoning_content ?? ''; });
  const fin = await helper.finalChatCompletion();
  assert.equal(fin.id.startsWith('chatcmpl-'), whole.id.startsWith('chatcmpl-'));
  assert.equal(fin.choices[0].message.role, 'assistant');
  assert.equal(fin.choices[0].message.content ?? '', c.message.content ?? '');
  assert.equal(reasoning, c.message.reasoning_content ?? '');
  assert.equal(fin.choices[0].finish_reason, c.finish_reason);
  // Without include_usage no usage chunk is sent.
  const plain = await chat.client.chat.completions.create({ ...body, stream: true });
  const plainChunks = [];
  for await (const chunk of plain) plainChunks.push(chunk);
  const p = assembleChat(plainChunks, chat.served);
  assert.equal(p.usage, null);
  assert.equal(p.content, c.message.content ?? '');
  assert.equal(p.reasoning_content, c.message.reasoning_content ?? '');
  assert.equal(p.finish_reason, c.finish_reason);
});

const TOOLS = [{
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Current weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
}, {
  type: 'function',
  function: { name: 'get_time', description: 'Current time', parameters: { type: 'object',
    properties: {} } },
}];
const WEATHER = [{ role: 'user', content: 'What is the weather in Paris?' }];

test('chat: tool_choice naming a function yields that tool call, streamed the same', async () => {
  const maxTokens = 16;
  const body = { model: chat.served, messages: WEATHER, tools: TOOLS, max_tokens: maxTokens,
    tool_choice: { type: 'function', function: { name: 'get_weather' } }, ...GREEDY };
  const whole = await chat.client.chat.completions.create(body);
  const c = checkCompletion(whole, maxTokens);
  assert.ok(['tool_calls', 'length'].includes(c.finish_reason), c.finish_reason);
  assert.ok(Array.isArray(c.message.tool_calls) && c.message.tool_calls.length >= 1);
  const call = c.message.tool_calls[0];
  assert.equal(call.type, 'function');
  assert.equal(call.function.name, 'get_weather');
  assert.equal(typeof call.id, 'string');
  assert.ok(call.id.length > 0);
  assert.equal(typeof call.function.arguments, 'string');
  const ids = new Set(c.message.tool_calls.map((t) => t.id));
  assert.equal(ids.size, c.message.tool_calls.length, 'tool call ids are unique');
  // The tools are part of the prompt: more prompt tokens than the same chat without them.
  assert.equal(whole.usage.prompt_tokens, await promptTokens(chat.port, { messages: WEATHER,
    tools: TOOLS, tool_choice: body.tool_choice }));
  assert.ok(whole.usage.prompt_tokens > await promptTokens(chat.port, { messages: WEATHER }));

  const stream = await chat.client.chat.completions.create({ ...body, stream: true,
    stream_options: { include_usage: true } });
  const chunks = [];
  for await (const chunk of stream) chunks.push(chunk);
  const a = assembleChat(chunks, chat.served);
  assert.equal(a.finish_reason, c.finish_reason);
  assert.equal(a.tool_calls.length, c.message.tool_calls.length);
  a.tool_calls.forEach((t, i) => {
    assert.equal(t.function.name, c.message.tool_calls[i].function.name);
    assert.equal(t.function.arguments, c.message.tool_calls[i].function.arguments);
  });
  assert.equal(a.content, c.message.content ?? '');
  assert.equal(a.reasoning_content, c.message.reasoning_content ?? '');
  assert.deepEqual(counts(a.usage), counts(whole.usage));
  // The client's helper assembles the same calls (and checks id/type/name/arguments are there).
  const fin = await chat.client.beta.chat.completions.stream(body).finalChatCompletion();
  assert.deepEqual(fin.choices[0].message.tool_calls.map((t) => [t.function.name,
    t.function.arguments]), c.message.tool_calls.map((t) => [t.function.name, t.function.arguments]));
});

test('chat: tool_choice "required" calls a declared function; "none" calls nothing', async () => {
  const maxTokens = 16;
  const req = await chat.client.chat.completions.create({ model: chat.served, messages: WEATHER,
    tools: TOOLS, tool_choice: 'required', max_tokens: maxTokens, ...GREEDY });
  const c = checkCompletion(req, maxTokens);
  // The model writes the name itself after "to=functions."; a random model may not finish one
  // within the limit, but whatever it exposes as a call must be complete and well-formed.
  for (const t of c.message.tool_calls ?? []) {
    assert.equal(t.type, 'function');
    assert.equal(typeof t.function.name, 'string');
    assert.equal(typeof t.id, 'string');
  }
  const none = await chat.client.chat.completions.create({ model: chat.served, messages: WEATHER,
    tools: TOOLS, tool_choice: 'none', max_tokens: maxTokens, ...GREEDY });
  const n = checkCompletion(none, maxTokens);
  assert.ok(!n.message.tool_calls || n.message.tool_calls.length === 0);
  assert.notEqual(n.finish_reason, 'tool_calls');
  // "none" leaves the tools out of the prompt.
  assert.equal(none.usage.prompt_tokens, await promptTokens(chat.port, { messages: WEATHER }));
});

test('chat: n = 2 gives two choices; streamed chunks name their index and assemble to them', async () => {
  const maxTokens = 8;
  const body = { model: chat.served, messages: MESSAGES, max_tokens: maxTokens, n: 2,
    temperature: 1, seed: 11 };
  const whole = await chat.client.chat.completions.create(body);
  assert.equal(whole.object, 'chat.completion');
  assert.equal(whole.choices.length, 2);
  assert.deepEqual(whole.choices.map((c) => c.index), [0, 1]);
  for (const c of whole.choices) {
    assert.equal(c.message.role, 'assistant');
    assert.ok(['stop', 'length', 'tool_calls'].includes(c.finish_reason), c.finish_reason);
  }
  // The prompt is counted once; completion tokens are summed over the choices.
  assert.equal(whole.usage.prompt_tokens, await promptTokens(chat.port, { messages: MESSAGES }));
  assert.ok(whole.usage.completion_tokens >= 2 && whole.usage.completion_tokens <= 2 * maxTokens);
  assert.equal(whole.usage.total_tokens, whole.usage.prompt_tokens + whole.usage.completion_tokens);
  // Same seed, streamed: chunks of both choices, each naming its index, assemble to the same.
  const stream = await chat.client.chat.completions.create({ ...body, stream: true,
    stream_options: { include_usage: true } });
  const byIndex = [[], []];
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) {
      assert.equal(usage, null, 'one usage chunk');
      usage = chunk.usage;
      continue;
    }
    assert.equal(chunk.choices.length, 1);
    const i = chunk.choices[0].index;
    assert.ok(i === 0 || i === 1, `index ${i}`);
    byIndex[i].push({ ...chunk, choices: [{ ...chunk.choices[0], index: 0 }] });
  }
  for (const i of [0, 1]) {
    const a = assembleChat(byIndex[i], chat.served);
    const c = whole.choices[i];
    assert.equal(a.content, c.message.content ?? '', `choice ${i} content`);
    assert.equal(a.reasoning_content, c.message.reasoning_content ?? '', `choice ${i} reasoning`);
    assert.equal(a.finish_reason, c.finish_reason);
  }
  assert.deepEqual(counts(usage), counts(whole.usage));
  // n out of range: a 400 naming n.
  await expectApiError(chat.client.chat.completions.create({ ...body, n: 17 }), 400, 'n');
});

test('chat: errors reach the client as APIError with status and param', async () => {
  await expectApiError(chat.client.chat.completions.create({ model: 'no-such-model',
    messages: MESSAGES }), 404, 'model');
  await expectApiError(chat.client.chat.completions.create({ model: chat.served, messages: [] }),
    400, 'messages');
  const e = await expectApiError(chat.client.chat.completions.create({ model: chat.served,
    messages: [{ role: 'user', content: 42 }] }), 400);
  assert.match(e.param ?? e.message, /messages/);
  await expectApiError(chat.client.chat.completions.create({ model: chat.served,
    messages: MESSAGES, tools: TOOLS, tool_choice: { type: 'function',
      function: { name: 'not_declared' } } }), 400);
  // Streaming requests fail before the stream starts, as a plain HTTP error.
  await expectApiError(chat.client.chat.completions.create({ model: chat.served, messages: [],
    stream: true }), 400, 'messages');
  // The embedding mesh serves no chat.
  await expectApiError(emb.client.chat.completions.create({ model: emb.served,
    messages: MESSAGES }), 400);
});

test('completions: prompt in, text out; streamed text equals the whole', async () => {
  const maxTokens = 10;
  const body = { model: chat.served, prompt: 'Once upon a time', max_tokens: maxTokens,
    ...GREEDY };
  const whole = await chat.client.completions.create(body);
  assert.equal(whole.object, 'text_completion');
  assert.equal(typeof whole.id, 'string');
  assert.equal(whole.model, chat.served);
  assert.equal(whole.choices.length, 1);
  const c = whole.choices[0];
  assert.equal(c.index, 0);
  assert.equal(typeof c.text, 'string');
  assert.ok(['stop', 'length'].includes(c.finish_reason), c.finish_reason);
  checkUsage(whole.usage, maxTokens, c.finish_reason);
  const stream = await chat.client.completions.create({ ...body, stream: true,
    stream_options: { include_usage: true } });
  let text = '';
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'text_completion');
    if (chunk.usage) usage = chunk.usage;
    for (const ch of chunk.choices ?? []) {
      text += ch.text ?? '';
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  assert.equal(text, c.text);
  assert.equal(finish, c.finish_reason);
  assert.deepEqual(counts(usage), counts(whole.usage));
});

// ---- responses (gpt-oss's own API) ------------------------------------------------------------
// The item texts of a Response in order: [type, text] (reasoning text, message text, or a call's
// "name(arguments)").
function itemTexts(output) {
  return output.map((o) => {
    if (o.type === 'function_call') return [o.type, `${o.name}(${o.arguments})`];
    const part = o.type === 'message' ? 'output_text' : 'reasoning_text';
    assert.ok(o.content.every((c) => c.type === part), JSON.stringify(o));
    return [o.type, o.content.map((c) => c.text).join('')];
  });
}

function checkResponse(r, maxTokens) {
  assert.equal(r.object, 'response');
  assert.ok(r.id.startsWith('resp_'), r.id);
  assert.equal(r.model, chat.served);
  assert.ok(Math.abs(r.created_at - Date.now() / 1000) < 600, 'created_at in unix seconds');
  assert.ok(['completed', 'incomplete'].includes(r.status), r.status);
  const u = r.usage;
  assert.ok(u.input_tokens > 0);
  assert.ok(u.output_tokens > 0 && u.output_tokens <= maxTokens, `output_tokens ${u.output_tokens}`);
  assert.equal(u.total_tokens, u.input_tokens + u.output_tokens);
  assert.ok(u.output_tokens_details.reasoning_tokens <= u.output_tokens);
  if (r.status === 'incomplete') {
    assert.equal(r.incomplete_details.reason, 'max_output_tokens');
    assert.equal(u.output_tokens, maxTokens);
  }
  for (const o of r.output) assert.ok(['reasoning', 'message', 'function_call'].includes(o.type));
  // The client's own convenience field: the message texts.
  assert.equal(r.output_text, r.output.filter((o) => o.type === 'message')
    .map((o) => o.content.map((c) => c.text).join('')).join(''));
  return r;
}

test('responses: create, streamed events and the stream helper agree under greedy', async () => {
  const maxTokens = 12;
  const body = { model: chat.served, input: 'Name three colours of a garden.',
    instructions: 'You are a terse assistant.', reasoning: { effort: 'low' },
    max_output_tokens: maxTokens, temperature: 0, metadata: { case: 'greedy' } };
  const whole = checkResponse(await chat.client.responses.create(body), maxTokens);
  assert.equal(whole.instructions, body.instructions);
  assert.ok(whole.output.length >= 1, JSON.stringify(whole));

  const stream = await chat.client.responses.create({ ...body, stream: true });
  const events = [];
  for await (const ev of stream) events.push(ev);
  assert.equal(events[0].type, 'response.created');
  assert.equal(events[1].type, 'response.in_progress');
  events.forEach((ev, i) => assert.equal(ev.sequence_number, i));
  const last = events[events.length - 1];
  assert.equal(last.type, whole.status === 'completed' ? 'response.completed'
    : 'response.incomplete');
  // The deltas, per output item, assemble to the final response's items.
  const items = [];
  for (const ev of events) {
    if (ev.type === 'response.output_item.added') {
      items[ev.output_index] = { type: ev.item.type, name: ev.item.name, text: '' };
    } else if (['response.output_text.delta', 'response.reasoning_text.delta',
      'response.function_call_arguments.delta'].includes(ev.type)) {
      items[ev.output_index].text += ev.delta;
    }
  }
  const assembled = items.map((it) => [it.type, it.type === 'function_call'
    ? `${it.name}(${it.text})` : it.text]);
  assert.deepEqual(assembled, itemTexts(last.response.output));
  assert.deepEqual(itemTexts(last.response.output), itemTexts(whole.output));
  assert.deepEqual(last.response.usage.output_tokens, whole.usage.output_tokens);
  assert.deepEqual(last.response.usage.input_tokens, whole.usage.input_tokens);

  // The client's stream helper: its text deltas and final response carry the same message text.
  const helper = chat.client.responses.stream(body);
  let text = '';
  helper.on('response.output_text.delta', (ev) => { text += ev.delta; });
  const fin = await helper.finalResponse();
  assert.equal(fin.id.startsWith('resp_'), true);
  assert.equal(text, whole.output_text);
  assert.equal(fin.output.filter((o) => o.type === 'message')
    .map((o) => o.content.map((c) => c.text).join('')).join(''), whole.output_text);
});

const RESP_TOOLS = [{ type: 'function', name: 'get_weather', description: 'Current weather in a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } }];

test('responses: a function call round trip through previous_response_id; errors', async () => {
  const maxTokens = 16;
  const first = checkResponse(await chat.client.responses.create({ model: chat.served,
    input: 'What is the weather in Paris?', tools: RESP_TOOLS, max_output_tokens: maxTokens,
    tool_choice: { type: 'function', name: 'get_weather' }, temperature: 0 }), maxTokens);
  const calls = first.output.filter((o) => o.type === 'function_call');
  assert.equal(calls.length, 1, JSON.stringify(first.output));
  assert.equal(calls[0].name, 'get_weather');
  assert.equal(typeof calls[0].call_id, 'string');
  assert.equal(typeof calls[0].arguments, 'string');
  const next = checkResponse(await chat.client.responses.create({ model: chat.served,
    previous_response_id: first.id, tools: RESP_TOOLS, max_output_tokens: 8,
    input: [{ type: 'function_call_output', call_id: calls[0].call_id, output: 'sunny, 21C' }] }), 8);
  assert.equal(next.previous_response_id, first.id);
  assert.ok(next.usage.input_tokens > first.usage.input_tokens);

  const nf = await expectApiError(chat.client.responses.create({ model: chat.served,
    previous_response_id: 'resp_no_such', input: 'x' }), 404, 'previous_response_id');
  assert.ok(nf instanceof OpenAI.NotFoundError);
  const unstored = await chat.client.responses.create({ model: chat.served, input: 'x',
    store: false, max_output_tokens: 2 });
  await expectApiError(chat.client.responses.create({ model: chat.served,
    previous_response_id: unstored.id, input: 'y' }), 404, 'previous_response_id');
  await expectApiError(chat.client.responses.create({ model: chat.served, input: 'x',
    tools: [{ type: 'web_search_preview' }] }), 400, 'tools');
  await expectApiError(chat.client.responses.create({ model: chat.served, input: 'x',
    max_output_tokens: 0 }), 400, 'max_output_tokens');
  await expectApiError(chat.client.responses.create({ model: 'no-such-model', input: 'x' }),
    404, 'model');
  // Streaming requests fail before the stream starts, as a plain HTTP error.
  await expectApiError(chat.client.responses.create({ model: chat.served, input: [],
    stream: true }), 400, 'input');
  // The embedding mesh serves no responses.
  await expectApiError(emb.client.responses.create({ model: emb.served, input: 'x' }), 400,
    'model');
});

test('responses: text.format json_schema constrains the answer (structured outputs)', async () => {
  // A bounded schema (a boolean and an integer), so the random model's answer always ends;
  // skip_reasoning (Garden's extension, sent as an extra body field) opens the final channel.
  const schema = { type: 'object', properties: { ok: { type: 'boolean' }, n: { type: 'integer' } },
    required: ['ok', 'n'], additionalProperties: false };
  for (let i = 0; i < 2; i++) {
    const r = checkResponse(await chat.client.responses.create({ model: chat.served,
      input: 'Answer in JSON.', max_output_tokens: 200, temperature: 1, skip_reasoning: true,
      text: { format: { type: 'json_schema', name: 'answer', strict: true, schema } } }), 200);
    assert.equal(r.status, 'completed', JSON.stringify(r));
    assert.equal(r.text.format.type, 'json_schema');
    const v = JSON.parse(r.output_text);
    assert.deepEqual(Object.keys(v).sort(), ['n', 'ok'], r.output_text);
    assert.equal(typeof v.ok, 'boolean', r.output_text);
    assert.ok(Number.isInteger(v.n), r.output_text);
  }
  await expectApiError(chat.client.responses.create({ model: chat.served, input: 'x',
    text: { format: { type: 'json_schema', name: 'a', schema: { type: 'integer', multipleOf: 2 } } } }),
    400, 'text');
});

// ---- main --------------------------------------------------------------------------------------
let failed = 0;
let ran = 0;
try {
  await setup();
  const only = typeof args.only === 'string' ? new RegExp(args.only) : null;
  for (const c of cases) {
    if (only && !only.test(c.name)) continue;
    const t0 = Date.now();
    ran++;
    try {
      await c.fn();
      log(`ok   ${c.name} (${Date.now() - t0} ms)`);
    } catch (e) {
      failed++;
      log(`FAIL ${c.name}\n${e?.stack ?? e}`);
    }
  }
} catch (e) {
  failed++;
  log(`FAIL setup\n${e?.stack ?? e}`);
} finally {
  await stopAll();
}
if (failed) {
  for (const f of fs.readdirSync(tmp).filter((n) => n.endsWith('.log'))) {
    const text = fs.readFileSync(path.join(tmp, f), 'utf8');
    log(`--- ${f} (last 3000 bytes) ---\n${text.slice(-3000)}`);
  }
}
if (!args.keep) fs.rmSync(tmp, { recursive: true, force: true });
log(failed ? `${failed} case(s) failed` : `${ran} of ${cases.length} cases ran, all passed`);
process.exit(failed || ran === 0 ? 1 : 0);
