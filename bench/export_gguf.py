"""Write a bf16 GGUF of our SmolLM2 checkpoint for the llama.cpp peer in the benchmark.

The same bf16 weights our engine runs, laid out the way llama.cpp expects:
GGUF tensor names, attn_q/attn_k rows re-permuted for llama.cpp's RoPE layout
(the inverse of what scripts/fetch_model.py undid), norms in f32. Metadata and
the tokenizer are copied from the original GGUF the checkpoint was converted from.

    .venv/bin/python bench/export_gguf.py models/smollm2-135m-instruct out.gguf
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[1]
ORIGINAL = REPO / "models" / ".cache" / "gguf" / "SmolLM2-135M-Instruct.Q4_1.gguf"
COPIED_FIELDS = ("tokenizer.", "llama.", "general.name", "general.basename")

LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF rotate_half rows -> llama.cpp's interleaved RoPE rows (convert_hf_to_gguf's permute)."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def copy_metadata(writer: gguf.GGUFWriter, reader: gguf.GGUFReader) -> None:
    for key, field in reader.fields.items():
        if not key.startswith(COPIED_FIELDS) or key == "general.architecture":
            continue
        value = field.contents()
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            writer.add_array(key, value)
        else:
            writer.add_key_value(key, value, vtype)


def main() -> int:
    model_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    config = json.loads((model_dir / "config.json").read_text())
    # numpy has no bfloat16: keep the raw bits as uint16
    tensors = {
        k: v.view(torch.int16).numpy().view(np.uint16)
        for k, v in load_file(model_dir / "model.safetensors").items()
    }
    reader = gguf.GGUFReader(ORIGINAL)
    writer = gguf.GGUFWriter(out, "llama")
    copy_metadata(writer, reader)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)

    def add(name: str, array: np.ndarray) -> None:
        if array.ndim == 1:  # norms in f32, as llama.cpp's converter writes them
            writer.add_tensor(name, bf16_to_f32(array))
        else:
            writer.add_tensor(name, array.view(np.uint16), raw_dtype=gguf.GGMLQuantizationType.BF16)

    add("token_embd.weight", tensors["model.embed_tokens.weight"])
    add("output_norm.weight", tensors["model.norm.weight"])
    for i in range(config["num_hidden_layers"]):
        for hf, ours in LAYER_NAMES.items():
            w = tensors[f"model.layers.{i}.{hf}"]
            if hf.startswith("self_attn.q_proj"):
                w = llama_cpp_permute(w, config["num_attention_heads"])
            elif hf.startswith("self_attn.k_proj"):
                w = llama_cpp_permute(w, config["num_key_value_heads"])
            add(f"blk.{i}.{ours}", w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"wrote {out}")
    return 0


def bf16_to_f32(a: np.ndarray) -> np.ndarray:
    return (a.view(np.uint16).astype(np.uint32) << 16).view(np.float32)


if __name__ == "__main__":
    sys.exit(main())
