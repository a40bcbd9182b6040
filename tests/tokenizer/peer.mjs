// The peer of sp-tokenize's byte-level BPE: js-tiktoken's GPT-2 encoding
// (its own ranks and pattern). Used by check_peer.sh and
// tools/bench_tokenize.sh.
//
//   node peer.mjs encode TEXT OUT.bin   GPT-2 ids of TEXT, little-endian uint16
//   node peer.mjs tokenizer-json ENCODER.json VOCAB.bpe OUT.json
//                                       GPT-2's files as a tokenizer.json
//   node peer.mjs time TEXT REPEATS     wall and CPU seconds per encode (least)
//
// Special tokens in the text are encoded as ordinary text, as sp does.
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { resolve } from "node:path";

const [cmd, ...args] = process.argv.slice(2);
// js-tiktoken is installed under NODE_PATH's folder by the driver.
const require = createRequire(resolve(process.env.SP_PEER_DIR) + "/");

function gpt2() {
  const { Tiktoken } = require("js-tiktoken/lite");
  const ranks = require("js-tiktoken/ranks/gpt2");
  return new Tiktoken(ranks.default ?? ranks);
}

if (cmd === "encode") {
  const [textPath, outPath] = args;
  const text = readFileSync(textPath, "utf8");
  const ids = gpt2().encode(text, [], []);
  const out = new Uint16Array(ids);
  writeFileSync(outPath, Buffer.from(out.buffer));
  console.log(`peer: ${ids.length} tokens`);
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
  console.error("usage: node peer.mjs encode|tokenizer-json|time ...");
  process.exit(2);
}
