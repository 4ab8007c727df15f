// serve_bench.mjs: load on a running `dflash serve`: at each concurrency,
// that many clients send streamed completions back to back (the held-out
// prompts of the embedded pair, in turn) until ROUNDS x concurrency
// requests are done; reports requests/s, generated tokens/s, time to first
// token (median, p90) and per-request decode speed. A benchmark, not a test.
//   node tools/bench/serve_bench.mjs http://127.0.0.1:8000 [conc,...] [max_tokens] [rounds]
import { readFileSync } from 'node:fs';

const base = process.argv[2] || 'http://127.0.0.1:8000';
const concs = (process.argv[3] || '1,4,16,64').split(',').map(Number);
const maxTokens = Number(process.argv[4] || 128);
const rounds = Number(process.argv[5] || 4);
const prompts = JSON.parse(readFileSync(new URL('../../tests/data/pystd/heldout_prompts.json', import.meta.url)))
  .prompts.map((p) => p.text);
const model = (await (await fetch(base + '/v1/models')).json()).data[0].id;

async function one(prompt) {
  const t0 = performance.now();
  const r = await fetch(base + '/v1/completions', { method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model, prompt, max_tokens: maxTokens, temperature: 0, stream: true,
      stream_options: { include_usage: true } }) });
  if (r.status !== 200) throw new Error(`status ${r.status}: ${await r.text()}`);
  const dec = new TextDecoder();
  let buf = '', ttft = null, tokens = 0;
  for await (const part of r.body) {
    buf += dec.decode(part, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, i);
      buf = buf.slice(i + 2);
      if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
      const ch = JSON.parse(ev.slice(6));
      if (ttft === null && ch.choices.length && ch.choices[0].text) ttft = performance.now() - t0;
      if (ch.usage) tokens = ch.usage.completion_tokens;
    }
  }
  const total = performance.now() - t0;
  return { ttft: ttft ?? total, total, tokens };
}

const pct = (a, q) => a.slice().sort((x, y) => x - y)[Math.min(a.length - 1, Math.floor(q * a.length))];
console.log(`model ${model}; max_tokens ${maxTokens}; greedy; ${rounds} requests per client`);
console.log('conc  requests  req/s   tok/s   ttft_p50_ms  ttft_p90_ms  tok/s/request');
for (const c of concs) {
  let next = 0;
  const res = [];
  const t0 = performance.now();
  await Promise.all(Array.from({ length: c }, async () => {
    for (let k = 0; k < rounds; k++) res.push(await one(prompts[next++ % prompts.length]));
  }));
  const wall = (performance.now() - t0) / 1000;
  const toks = res.reduce((s, r) => s + r.tokens, 0);
  const perReq = res.map((r) => r.tokens / Math.max(1e-3, (r.total - r.ttft) / 1000));
  console.log(`${String(c).padStart(4)}  ${String(res.length).padStart(8)}  ${(res.length / wall).toFixed(2).padStart(5)}  ` +
    `${(toks / wall).toFixed(0).padStart(6)}  ${pct(res.map((r) => r.ttft), 0.5).toFixed(1).padStart(11)}  ` +
    `${pct(res.map((r) => r.ttft), 0.9).toFixed(1).padStart(11)}  ${pct(perReq, 0.5).toFixed(0).padStart(13)}`);
}
