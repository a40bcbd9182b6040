// The peer of sp-tokenize's byte-level BPE: js-tiktoken's encodings (their
// own ranks and patterns). Used by check_peer.sh and tools/bench_tokenize.py.
//
//   node peer.mjs encode ENC TEXT OUT.bin    ENC's ids of TEXT (gpt2: uint16,
//                                            cl100k_base: uint32; little-endian)
//   node peer.mjs tokenizer-json ENCODER.json VOCAB.bpe OUT.json
//                                            GPT-2's files as a tokenizer.json
//   node peer.mjs ranks-json ENC OUT.json    ENC's ranks as a tokenizer.json:
//                                            Llama 3's form (a Split regex, then
//                                            ByteLevel; ignore_merges)
//   node peer.mjs time TEXT REPEATS          wall and CPU seconds per GPT-2
//                                            encode (least)
//
// Special tokens in the text are encoded as ordinary text, as sp does.
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { resolve } from "node:path";

const [cmd, ...args] = process.argv.slice(2);
// js-tiktoken is installed under SP_PEER_DIR by the driver.
const require = createRequire(resolve(process.env.SP_PEER_DIR) + "/");

function encoding(name) {
  const { Tiktoken } = require("js-tiktoken/lite");
  const ranks = require(`js-tiktoken/ranks/${name}`);
  return [new Tiktoken(ranks.default ?? ranks), ranks.default ?? ranks];
}
const gpt2 = () => encoding("gpt2")[0];

/// GPT-2's bytes_to_unicode: the character that spells byte b.
function byteChar(b) {
  const printable = (c) => (c >= 0x21 && c <= 0x7e) || (c >= 0xa1 && c <= 0xac) || (c >= 0xae && c <= 0xff);
  if (printable(b)) return String.fromCodePoint(b);
  let n = 0;
  for (let c = 0; c < b; ++c) if (!printable(c)) ++n;
  return String.fromCodePoint(256 + n);
}
const spell = (bytes) => Array.from(bytes, byteChar).join("");

/// The two tokens tiktoken's BPE joins last into `bytes`, using only the
/// ranks below its own (Hugging Face's conversion of tiktoken ranks).
function lastMerge(bytes, rank, rankMap) {
  let parts = Array.from(bytes, (b) => [b]);
  for (;;) {
    let best = -1, bestRank = Infinity;
    for (let i = 0; i + 1 < parts.length; ++i) {
      const r = rankMap.get(parts[i].concat(parts[i + 1]).join(","));
      if (r !== undefined && r < rank && r < bestRank) { best = i; bestRank = r; }
    }
    if (best < 0) break;
    parts.splice(best, 2, parts[best].concat(parts[best + 1]));
  }
  return parts.length === 2 ? parts : null;
}

if (cmd === "encode") {
  const [name, textPath, outPath] = args;
  const text = readFileSync(textPath, "utf8");
  const ids = encoding(name)[0].encode(text, [], []);
  const out = name === "gpt2" ? new Uint16Array(ids) : new Uint32Array(ids);
  writeFileSync(outPath, Buffer.from(out.buffer));
  console.log(`peer: ${ids.length} ${name} tokens`);
} else if (cmd === "ranks-json") {
  const [name, outPath] = args;
  const [enc, ranks] = encoding(name);
  const vocab = {}, merges = [];
  const tokens = [...enc.textMap.entries()].sort((a, b) => a[0] - b[0]);
  for (const [rank, bytes] of tokens) {
    vocab[spell(bytes)] = rank;
    if (bytes.length < 2) continue;
    const m = lastMerge(bytes, rank, enc.rankMap);
    if (!m) throw new Error(`${name}: token ${rank} is no merge of two tokens`);
    merges.push(`${spell(m[0])} ${spell(m[1])}`);
  }
  const added = Object.entries(ranks.special_tokens).map(([content, id]) => ({ id, content, special: true }));
  const json = {
    version: "1.0",
    added_tokens: added,
    normalizer: null,
    pre_tokenizer: { type: "Sequence", pretokenizers: [
      { type: "Split", pattern: { Regex: ranks.pat_str }, behavior: "Isolated", invert: false },
      { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: false }] },
    model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: null,
             end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, ignore_merges: true,
             vocab, merges },
  };
  writeFileSync(outPath, JSON.stringify(json));
} else if (cmd === "tokenizer-json") {
  const [encoderPath, bpePath, outPath] = args;
  const vocab = JSON.parse(readFileSync(encoderPath, "utf8"));
  const merges = readFileSync(bpePath, "utf8")
    .split("\n")
    .filter((l) => l && !l.startsWith("#version"));
  const json = {
    version: "1.0",
    added_tokens: [{ id: 50256, content: "<|endoftext|>", special: true }],
    normalizer: null,
    pre_tokenizer: { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true },
    model: { type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: "",
             end_of_word_suffix: "", fuse_unk: false, vocab, merges },
  };
  writeFileSync(outPath, JSON.stringify(json));
} else if (cmd === "time") {
  // Seconds of wall and CPU time per encode, the least of REPEATS.
  const [textPath, repeats] = args;
  const text = readFileSync(textPath, "utf8");
  const enc = gpt2();
  let wall = Infinity, cpu = Infinity;
  for (let i = 0; i < Number(repeats); ++i) {
    const t0 = process.hrtime.bigint(), c0 = process.cpuUsage();
    enc.encode(text, [], []);
    const c = process.cpuUsage(c0);
    wall = Math.min(wall, Number(process.hrtime.bigint() - t0) / 1e9);
    cpu = Math.min(cpu, (c.user + c.system) / 1e6);
  }
  console.log(`${wall} ${cpu}`);
} else {
  console.error("usage: node peer.mjs encode|tokenizer-json|ranks-json|time ...");
  process.exit(2);
}
