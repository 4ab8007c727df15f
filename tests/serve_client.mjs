// serve_client.mjs: drives a running `dflash serve` (the embedded pair) with
// the official openai npm client and plain fetch; run by tests/serve_check.sh,
// which starts the servers and passes, in the environment:
//   NPM_DIR   folder whose node_modules holds openai
//   BASE      http://127.0.0.1:PORT of the main server (API key KEY,
//             --max-body-bytes 65536)
//   BASE_SMALL a second server with --max-sessions 1 --max-queue 0 (no key)
//   BASE_KV   a third with --max-sessions 4 --kv-pages 6 (no key)
//   BASE_IDLE a fourth with --max-sessions 1 --max-queue 0 --client-timeout 1
//             (no key; 33 connections at most)
//   EXPECT    file with the text `dflash generate` gives PROMPT (32 tokens)
//   PROMPT    that prompt;  SERVER_PID  the main server's pid
//   RSS_CHECK 0: leave out the resident-memory bound (sanitizer builds)
// Prints "ok NAME" or "FAIL NAME: why" per check and "RESULT passed failed".
import { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';
import net from 'node:net';

const require = createRequire(process.env.NPM_DIR + '/');
const OpenAI = require('openai');
const BASE = process.env.BASE, KEY = 'test-key', MODEL = 'qwen3-pystd';
const client = new OpenAI({ apiKey: KEY, baseURL: BASE + '/v1', maxRetries: 0 });
let passed = 0, failed = 0;
function check(name, ok, why) {
  if (ok) { passed++; console.log(`ok ${name}`); } else { failed++; console.log(`FAIL ${name}: ${why}`); }
}
async function attempt(name, fn) {
  try { await fn(); } catch (e) { check(name, false, String(e && e.stack || e)); }
}
const chatMsgs = (i) => [{ role: 'user', content: `Write a Python function number ${i} that sorts a list.` }];

async function chatOnce(i, extra = {}) {
  const r = await client.chat.completions.create({ model: MODEL, messages: chatMsgs(i), max_tokens: 40, ...extra });
  return r;
}
async function chatStream(i, extra = {}) {
  const s = await client.chat.completions.create({ model: MODEL, messages: chatMsgs(i), max_tokens: 40, stream: true,
    stream_options: { include_usage: true }, ...extra });
  let text = '', finish = null, usage = null, role = null;
  for await (const ch of s) {
    if (ch.usage) usage = ch.usage;
    for (const c of ch.choices) {
      if (c.delta && c.delta.role) role = c.delta.role;
      if (c.delta && c.delta.content) text += c.delta.content;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  return { text, finish, usage, role };
}
async function raw(path, init = {}, base = BASE) {
  const r = await fetch(base + path, init);
  let body = null;
  try { body = await r.json(); } catch { body = null; }
  return { status: r.status, body, allow: r.headers.get('allow') };
}
const post = (body, headers = {}) => ({ method: 'POST', body: typeof body === 'string' ? body : JSON.stringify(body),
  headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}`, ...headers } });
function rssKiB(pid) {
  const m = /VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) : NaN;
}

await attempt('models list', async () => {
  const page = await client.models.list();
  const ids = page.data.map((m) => m.id);
  check('models list', ids.length === 1 && ids[0] === MODEL, JSON.stringify(ids));
  const one = await client.models.retrieve(MODEL);
  check('one model by its id', one.id === MODEL && one.object === 'model', JSON.stringify(one));
  const none = await raw('/v1/models/gpt-4', { headers: { authorization: `Bearer ${KEY}` } });
  check('a model not served: 404 naming model', none.status === 404 && none.body.error.param === 'model' &&
    /gpt-4/.test(none.body.error.message), JSON.stringify(none));
  const head = await fetch(BASE + '/health', { method: 'HEAD' });
  check('HEAD /health: 200, no body', head.status === 200 && (await head.text()) === '', String(head.status));
});

const expect = readFileSync(process.env.EXPECT, 'utf8');
await attempt('greedy completion equals dflash generate', async () => {
  const r = await client.completions.create({ model: MODEL, prompt: process.env.PROMPT, max_tokens: 32, temperature: 0 });
  check('greedy completion equals dflash generate', r.choices[0].text === expect,
    `got ${JSON.stringify(r.choices[0].text)}, want ${JSON.stringify(expect)}`);
  const u = r.usage;
  check('usage fields', u && u.completion_tokens === 32 && u.prompt_tokens > 0 &&
    u.total_tokens === u.prompt_tokens + u.completion_tokens && r.dflash && r.dflash.mean_accept >= 1,
    JSON.stringify({ usage: u, dflash: r.dflash }));
  check('finish_reason length', r.choices[0].finish_reason === 'length', r.choices[0].finish_reason);
});

await attempt('frequency and presence penalties as dflash generate applies them', async () => {
  const want = readFileSync(process.env.EXPECT_PEN, 'utf8');
  const r = await client.completions.create({ model: MODEL, prompt: process.env.PROMPT, max_tokens: 32, temperature: 0,
    frequency_penalty: 1.5, presence_penalty: 0.5 });
  check('penalized greedy completion equals dflash generate with the same penalties', r.choices[0].text === want,
    `got ${JSON.stringify(r.choices[0].text)}, want ${JSON.stringify(want)}`);
  check('the penalties change the greedy text', want !== expect, JSON.stringify(want));
  const big = await raw('/v1/completions', post({ prompt: 'x', presence_penalty: 2.5 }));
  check('presence_penalty 2.5: 400 naming it and its range', big.status === 400 &&
    big.body.error.param === 'presence_penalty' && /2\.5/.test(big.body.error.message), JSON.stringify(big));
});

await attempt('stop strings', async () => {
  const cut = expect.indexOf('\n');
  const r = await client.completions.create({ model: MODEL, prompt: process.env.PROMPT, max_tokens: 32, stop: ['\n'] });
  const want = cut >= 0 ? expect.slice(0, cut) : expect;
  check('stop string cuts the text', r.choices[0].text === want && (cut < 0 || r.choices[0].finish_reason === 'stop'),
    `got ${JSON.stringify(r.choices[0].text)} (${r.choices[0].finish_reason}), want ${JSON.stringify(want)}`);
  const s = await client.completions.create({ model: MODEL, prompt: process.env.PROMPT, max_tokens: 32, stop: ['\n'],
    stream: true });
  let text = '';
  for await (const ch of s) for (const c of ch.choices) text += c.text || '';
  check('streamed stop string never leaks', text === want, `streamed ${JSON.stringify(text)}`);
});

await attempt('chat streamed equals not streamed', async () => {
  const a = await chatOnce(0);
  const b = await chatStream(0);
  check('chat streamed equals not streamed', a.choices[0].message.content === b.text && b.role === 'assistant' &&
    b.finish === a.choices[0].finish_reason && b.usage && b.usage.completion_tokens === a.usage.completion_tokens,
    `${JSON.stringify(a.choices[0].message.content)} vs ${JSON.stringify(b.text)}; ${JSON.stringify(b.usage)}`);
});

await attempt('16 concurrent streams', async () => {
  const alone = [];
  for (let i = 1; i <= 16; i++) alone.push((await chatOnce(i)).choices[0].message.content);
  const together = await Promise.all(Array.from({ length: 16 }, (_, k) => chatStream(k + 1)));
  const bad = together.map((t, k) => (t.text === alone[k] ? -1 : k)).filter((k) => k >= 0);
  check('16 concurrent streams each equal their request alone', bad.length === 0,
    `differ: ${bad.join(',')}: ${bad.length ? JSON.stringify(together[bad[0]].text) + ' vs ' + JSON.stringify(alone[bad[0]]) : ''}`);
  const seeded = { temperature: 0.8, top_k: 40, seed: 7 };
  const s1 = await chatOnce(3, seeded), s2 = await chatStream(3, seeded);
  check('seeded sampling: streamed equals not streamed', s1.choices[0].message.content === s2.text,
    `${JSON.stringify(s1.choices[0].message.content)} vs ${JSON.stringify(s2.text)}`);
});

await attempt('error statuses', async () => {
  const noKey = await raw('/v1/completions', { method: 'POST', body: JSON.stringify({ prompt: 'x' }) });
  check('no API key: 401', noKey.status === 401 && noKey.body && noKey.body.error, JSON.stringify(noKey));
  const badJson = await raw('/v1/completions', post('{"prompt": '));
  check('malformed JSON: 400', badJson.status === 400 && badJson.body.error.type === 'invalid_request_error',
    JSON.stringify(badJson));
  const n2 = await raw('/v1/chat/completions', post({ messages: chatMsgs(0), n: 2 }));
  check('n = 2: 400 naming n', n2.status === 400 && n2.body.error.param === 'n', JSON.stringify(n2));
  const noMsgs = await raw('/v1/chat/completions', post({ model: MODEL }));
  check('no messages: 400 naming messages', noMsgs.status === 400 && noMsgs.body.error.param === 'messages',
    JSON.stringify(noMsgs));
  const temp = await raw('/v1/completions', post({ prompt: 'x', temperature: -1 }));
  check('temperature -1: 400 naming it', temp.status === 400 && temp.body.error.param === 'temperature',
    JSON.stringify(temp));
  const so = await raw('/v1/completions', post({ prompt: 'x', stream_options: 5 }));
  check('stream_options not an object: 400 naming it', so.status === 400 &&
    so.body.error.param === 'stream_options', JSON.stringify(so));
  const kw = await raw('/v1/chat/completions', post({ messages: chatMsgs(0),
    chat_template_kwargs: { enable_thinking: 'yes' } }));
  check('enable_thinking not a boolean: 400 naming it', kw.status === 400 &&
    kw.body.error.param === 'chat_template_kwargs.enable_thinking' && /got the string "yes"/.test(kw.body.error.message),
    JSON.stringify(kw));
  const rf = await raw('/v1/chat/completions', post({ messages: chatMsgs(0), response_format: { type: 'json_object' } }));
  check('response_format json_object: 400, refused not ignored', rf.status === 400 &&
    rf.body.error.param === 'response_format', JSON.stringify(rf));
  const lb = await raw('/v1/completions', post({ prompt: 'x', logit_bias: { 5: 10 } }));
  check('logit_bias: 400, refused not ignored', lb.status === 400 && lb.body.error.param === 'logit_bias',
    JSON.stringify(lb));
  const mtStr = await raw('/v1/completions', post({ prompt: 'x', max_tokens: '10' }));
  check('max_tokens as a string: 400 with the value', mtStr.status === 400 && mtStr.body.error.param === 'max_tokens' &&
    /from 1 to \d+, got the string "10"/.test(mtStr.body.error.message), JSON.stringify(mtStr));
  const mtReal = await raw('/v1/completions', post({ prompt: 'x', max_tokens: 2.0, temperature: 0 }));
  check('max_tokens 2.0 (a whole number with a point): served', mtReal.status === 200, JSON.stringify(mtReal));
  const role = await raw('/v1/chat/completions', post({ messages: [{ role: 'user', content: 'a' }, { role: 'wizard', content: 'b' }] }));
  check('unknown role: 400 naming the message and the role', role.status === 400 &&
    role.body.error.param === 'messages' && /\[1\]\.role .*got the string "wizard"/.test(role.body.error.message),
    JSON.stringify(role));
  const model = await raw('/v1/completions', post({ model: 'gpt-4', prompt: 'x' }));
  check('unknown model: 404', model.status === 404 && model.body.error.param === 'model', JSON.stringify(model));
  const long = await raw('/v1/completions', post({ prompt: 'x', max_tokens: 100000 }));
  check('past the context by max_tokens: 400 naming max_tokens and its most', long.status === 400 &&
    long.body.error.param === 'max_tokens' && /max_tokens may be at most \d+, got 100000/.test(long.body.error.message),
    JSON.stringify(long));
  const longPrompt = await raw('/v1/completions', post({ prompt: 'def f(): pass\n'.repeat(1500), max_tokens: 4 }));
  check('a prompt past the context: 400 naming the prompt', longPrompt.status === 400 &&
    longPrompt.body.error.param === 'prompt' && /leaving no room/.test(longPrompt.body.error.message),
    JSON.stringify(longPrompt).slice(0, 300));
  const big = await raw('/v1/completions', post({ prompt: 'y'.repeat(100000) }));
  check('body over the limit: 413', big.status === 413, JSON.stringify(big));
  const method = await raw('/v1/chat/completions', { headers: { authorization: `Bearer ${KEY}` } });
  check('GET on a POST route: 405 naming POST in Allow', method.status === 405 && method.allow === 'POST',
    JSON.stringify(method));
  const onGet = await raw('/health', { method: 'DELETE' });
  check('DELETE on a GET route: 405, Allow: GET, HEAD', onGet.status === 405 && onGet.allow === 'GET, HEAD',
    JSON.stringify(onGet));
  const route = await raw('/v2/nothing');
  check('unknown route: 404', route.status === 404, JSON.stringify(route));
  try {
    await client.completions.create({ model: MODEL, prompt: 'x', frequency_penalty: -3 });
    check('the client sees 400 as an error', false, 'no error thrown');
  } catch (e) {
    check('the client sees 400 as an error', e.status === 400, String(e));
  }
});

await attempt('full queue: 429', async () => {
  const small = process.env.BASE_SMALL;
  const body = { prompt: 'import os', max_tokens: 300, ignore_eos: true };
  const rs = await Promise.all(Array.from({ length: 4 }, () => raw('/v1/completions', post(body), small)));
  const codes = rs.map((r) => r.status).sort();
  check('full queue: 429 with an error object', codes.filter((c) => c === 200).length >= 1 &&
    codes.filter((c) => c === 429).length >= 1 && rs.every((r) => r.status !== 429 || r.body.error),
    JSON.stringify(codes));
});

async function metric(name) {
  const t = await (await fetch(BASE + '/metrics')).text();
  const m = new RegExp('^' + name.replace(/[.*+?^${}()|[\]\\]/g, '\\$&') + ' (\\S+)$', 'm').exec(t);
  return m ? Number(m[1]) : NaN;
}

await attempt('client leaving mid-stream', async () => {
  const before = await metric('dflash_requests_total{outcome="cancelled"}');
  const ac = new AbortController();
  const r = await fetch(BASE + '/v1/completions', { ...post({ prompt: 'import os', max_tokens: 2000, ignore_eos: true,
    stream: true }), signal: ac.signal });
  const reader = r.body.getReader();
  await reader.read();
  ac.abort();
  let running = NaN, cancelled = NaN;
  for (let t = 0; t < 100; t++) {
    running = await metric('dflash_running_sessions');
    cancelled = await metric('dflash_requests_total{outcome="cancelled"}');
    if (running === 0 && cancelled === before + 1) break;
    await new Promise((res) => setTimeout(res, 100));
  }
  check('a client leaving mid-stream frees its session', running === 0 && cancelled === before + 1,
    `running ${running}, cancelled ${before} -> ${cancelled}`);
});

await attempt('speculative metrics', async () => {
  const drafted = await metric('dflash_spec_drafted_tokens_total');
  const accepted = await metric('dflash_spec_accepted_tokens_total');
  const steps = await metric('dflash_spec_steps_total');
  const count = await metric('dflash_spec_acceptance_length_count');
  const sum = await metric('dflash_spec_acceptance_length_sum');
  const gen = await metric('dflash_generated_tokens_total');
  const p1 = await metric('dflash_spec_position_drafted_total{position="1"}');
  const a1 = await metric('dflash_spec_position_accepted_total{position="1"}');
  const p2 = await metric('dflash_spec_position_drafted_total{position="2"}');
  const tpot = await metric('dflash_time_per_output_token_seconds_count');
  const ttftInf = await metric('dflash_time_to_first_token_seconds_bucket{le="+Inf"}');
  const ttftCount = await metric('dflash_time_to_first_token_seconds_count');
  check('latency histograms filled', tpot > 0 && ttftCount > 0 && ttftInf === ttftCount,
    JSON.stringify({ tpot, ttftInf, ttftCount }));
  check('speculative metrics agree with each other', drafted > 0 && accepted <= drafted && count === steps &&
    sum <= gen && sum >= steps && p1 >= p2 && a1 <= p1 && p1 > 0,
    JSON.stringify({ drafted, accepted, steps, count, sum, gen, p1, a1, p2 }));
  // the drafter's block is 16: draft positions 1..15, commit buckets le 0..15 (16 falls in +Inf)
  const p15 = await metric('dflash_spec_position_drafted_total{position="15"}');
  const p16 = await metric('dflash_spec_position_drafted_total{position="16"}');
  const le15 = await metric('dflash_spec_acceptance_length_bucket{le="15"}');
  const le16 = await metric('dflash_spec_acceptance_length_bucket{le="16"}');
  check('speculative metrics cover the block\'s positions and no more',
    Number.isFinite(p15) && Number.isNaN(p16) && Number.isFinite(le15) && le15 <= count && Number.isNaN(le16),
    JSON.stringify({ p15, p16, le15, le16 }));
});

await attempt('a KV page budget', async () => {
  // 6 pages of 16 positions; each request reaches its prompt + 32 + a
  // block of 16 (4 pages): one runs, the others wait for its pages
  const kv = new OpenAI({ apiKey: 'none', baseURL: process.env.BASE_KV + '/v1', maxRetries: 0 });
  const req = { model: MODEL, prompt: process.env.PROMPT, max_tokens: 32, temperature: 0 };
  const rs = await Promise.all([1, 2, 3].map(() => kv.completions.create(req)));
  check('kv pages: requests that wait for pages get what one alone gets', rs.every((r) => r.choices[0].text === expect),
    JSON.stringify(rs.map((r) => r.choices[0].text)));
  const kvMetrics = await (await fetch(process.env.BASE_KV + '/metrics')).text();
  const gauge = (name) => Number((kvMetrics.match(new RegExp(`^${name} (\\d+)$`, 'm')) || [])[1]);
  check('kv pages: metrics show the pool, nothing held or waiting once done', gauge('dflash_kv_pages') === 6 &&
    gauge('dflash_kv_pages_reserved') === 0 && gauge('dflash_sessions_waiting_for_pages') === 0,
    kvMetrics.split('\n').filter((l) => /kv_pages|waiting_for/.test(l)).join('; '));
  const over = await raw('/v1/completions', post({ prompt: process.env.PROMPT, max_tokens: 400 }), process.env.BASE_KV);
  check('kv pages: a request needing more than all of them: 400', over.status === 400 &&
    /KV pages/.test(over.body.error.message), JSON.stringify(over));
});

await attempt('200 requests in a row', async () => {
  const pid = Number(process.env.SERVER_PID);
  const req = { model: MODEL, prompt: process.env.PROMPT, max_tokens: 8, temperature: 0 };
  const first = (await client.completions.create(req)).choices[0].text;
  for (let i = 0; i < 20; i++) await client.completions.create(req); // warm the allocator
  const rss0 = rssKiB(pid);
  let bad = 0;
  for (let i = 0; i < 200; i++) {
    const r = await client.completions.create({ ...req, stream: i % 2 === 1 });
    let text = '';
    if (i % 2 === 1) { for await (const ch of r) for (const c of ch.choices) text += c.text || ''; }
    else text = r.choices[0].text;
    if (text !== first) bad++;
  }
  const rss1 = rssKiB(pid);
  check('200 requests: none lost, mixed or truncated', bad === 0, `${bad} differ`);
  // (not under AddressSanitizer, whose quarantine keeps freed memory)
  if (process.env.RSS_CHECK !== '0')
    check('200 requests: resident memory grows less than 16 MiB', rss1 - rss0 < 16384, `${rss0} -> ${rss1} KiB`);
});

await attempt('clients that stall', async () => {
  // 40 connections that promise a body and send one byte of it: more than
  // the server's connection limit. Its client timeout closes them, and it
  // answers again; a request running past the timeout is not cut.
  const url = new URL(process.env.BASE_IDLE);
  const closed = [];
  const socks = Array.from({ length: 40 }, () => {
    const s = net.connect(Number(url.port), url.hostname);
    s.on('error', () => {});
    const done = new Promise((res) => s.on('close', res));
    closed.push(done);
    s.write('POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{');
    return s;
  });
  const all = await Promise.race([Promise.all(closed).then(() => true),
    new Promise((res) => setTimeout(() => res(false), 6000))]);
  check('stalled clients: the server closes them after its client timeout', all,
    `${socks.filter((s) => !s.destroyed).length} still open after 6 s`);
  const h = await raw('/health', { signal: AbortSignal.timeout(5000) }, process.env.BASE_IDLE);
  check('stalled clients: the server answers again', h.status === 200, JSON.stringify(h));
  const long = await raw('/v1/completions', post({ prompt: process.env.PROMPT, max_tokens: 2000, ignore_eos: true,
    temperature: 0 }), process.env.BASE_IDLE);
  check('a request running past the client timeout completes', long.status === 200 &&
    long.body.usage.completion_tokens === 2000, JSON.stringify(long).slice(0, 300));
  socks.forEach((s) => s.destroy());
});

console.log(`RESULT ${passed} ${failed}`);
