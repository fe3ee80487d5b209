"""Write a tiny llama GGUF with random weights and a real vocabulary.

usage: make-tiny-model.py VOCAB.gguf OUT.gguf [--dim 64 --layers 2 --heads 4 --ff 128 --ctx 2048] [--fim]

The vocabulary (every `tokenizer.*` field) is copied from VOCAB.gguf, so llama-server tokenizes and
templates exactly as it would for a real llama model; the weights are seeded random numbers, so the
text it generates is gibberish but the slots, streaming and `usage` are real.

--fim names three tokens of the vocabulary as the fill-in-the-middle prefix, suffix and middle
markers (`tokenizer.ggml.fim_*_token_id`), which llama-server requires before it serves `/infill`.
"""
import argparse

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter


def field_value(field):
    if hasattr(field, "contents"):
        return field.contents()
    kind = field.types[0]
    if kind == GGUFValueType.ARRAY:
        if field.types[1] == GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8", "replace") for i in field.data]
        return [field.parts[i][0].item() for i in field.data]
    if kind == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    return field.parts[field.data[0]][0].item()


def copy_tokenizer(reader, writer):
    n_vocab = 0
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        value = field_value(field)
        kind = field.types[0]
        if kind == GGUFValueType.ARRAY:
            sub = field.types[1]
            writer.add_array(name, value) if sub != GGUFValueType.STRING else writer.add_array(name, value)
            if name == "tokenizer.ggml.tokens":
                n_vocab = len(value)
        elif kind == GGUFValueType.STRING:
            writer.add_string(name, value)
        elif kind == GGUFValueType.BOOL:
            writer.add_bool(name, bool(value))
        elif kind in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64):
            writer.add_float32(name, float(value))
        elif kind in (GGUFValueType.INT32, GGUFValueType.INT8, GGUFValueType.INT16, GGUFValueType.INT64):
            writer.add_int32(name, int(value))
        else:
            writer.add_uint32(name, int(value))
    return n_vocab


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("vocab")
    ap.add_argument("out")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--ff", type=int, default=128)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--fim", action="store_true")
    a = ap.parse_args()

    reader = GGUFReader(a.vocab)
    writer = GGUFWriter(a.out, "llama")
    writer.add_name("slotgate-tiny-random")
    writer.add_context_length(a.ctx)
    writer.add_embedding_length(a.dim)
    writer.add_block_count(a.layers)
    writer.add_feed_forward_length(a.ff)
    writer.add_head_count(a.heads)
    writer.add_head_count_kv(a.heads)
    writer.add_rope_dimension_count(a.dim // a.heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(0)  # all f32
    n_vocab = copy_tokenizer(reader, writer)
    if not n_vocab:
        raise SystemExit("no tokenizer.ggml.tokens in " + a.vocab)
    if a.fim:
        # Any three distinct ids will do for random weights: the last three of the vocabulary.
        writer.add_uint32("tokenizer.ggml.fim_pre_token_id", n_vocab - 3)
        writer.add_uint32("tokenizer.ggml.fim_suf_token_id", n_vocab - 2)
        writer.add_uint32("tokenizer.ggml.fim_mid_token_id", n_vocab - 1)

    rng = np.random.default_rng(a.seed)

    def rand(*shape):
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    d, ff = a.dim, a.ff
    writer.add_tensor("token_embd.weight", rand(n_vocab, d))
    writer.add_tensor("output_norm.weight", np.ones(d, dtype=np.float32))
    writer.add_tensor("output.weight", rand(n_vocab, d))
    for i in range(a.layers):
        p = f"blk.{i}."
        writer.add_tensor(p + "attn_norm.weight", np.ones(d, dtype=np.float32))
        for t in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(p + t + ".weight", rand(d, d))
        writer.add_tensor(p + "ffn_norm.weight", np.ones(d, dtype=np.float32))
        writer.add_tensor(p + "ffn_gate.weight", rand(ff, d))
        writer.add_tensor(p + "ffn_up.weight", rand(ff, d))
        writer.add_tensor(p + "ffn_down.weight", rand(d, ff))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    main()
