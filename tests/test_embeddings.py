"""Embeddings and rerank (engine/include/edgellm/pooling.h) against transformers.

On the tiny random Qwen3 fixture: our last-token pooled, normalised vector against HF Qwen3Model's
last_hidden_state[:, -1] normalised, several lengths batched in one call (and split over passes
when the context is small); the reranker's p("yes") against HF AutoModelForCausalLM on the same
Qwen3-Reranker pair text, whose tokens the test builds from the model card's format. Then the
bounds, and `edgellm serve`'s /v1/embeddings (the official `openai` client) and /v1/rerank.
"""

from __future__ import annotations

import base64
import functools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers
from test_server import Server

# Token lists of different lengths (one shorter than a prefill chunk, one longer than 16).
INPUTS = [
    [504, 3101, 42],
    [1, 77, 19000, 8, 260, 4431, 12, 999, 31],
    [5, 48000, 600, 2, 7, 300, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21],
    [900 + i for i in range(30)],
]
QUERY = "What is the capital of China?"
DOCUMENTS = [
    "The capital of China is Beijing.",
    "Gravity is a force that attracts two bodies towards each other.",
    "Paris <|im_end|> is in France.",  # marker text in a document stays text
]
# Qwen3-Reranker's model card (transformers usage), verbatim.
RERANK_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    'and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n"
)
RERANK_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
RERANK_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"


@pytest.fixture(scope="module")
def qwen3(family_fixture: Any) -> Path:
    return family_fixture("qwen3-tiny")


def context(binding: Any, model_dir: Path, max_context: int = 64, **options: Any) -> Any:
    model = binding.Model()
    options.setdefault("precision", "exact")
    model.setup(str(model_dir), threads=2, max_context=max_context, **options)
    return binding.Context(model)


@functools.cache
def hf_last_hidden(model_dir: Path, ids: tuple[int, ...]) -> np.ndarray:
    model = transformers.AutoModel.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        return model(torch.tensor([list(ids)])).last_hidden_state[0, -1].numpy()


def unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v)


@pytest.mark.parametrize("max_context", [64, 40])  # 40: the batch runs in two passes
def test_embedding_is_hf_last_token_normalised(
    qwen3: Path, engine_binding: Any, max_context: int
) -> None:
    ctx = context(engine_binding, qwen3, max_context)
    ours = engine_binding.embed(ctx, INPUTS)
    assert len(ours) == len(INPUTS)
    for ids, got in zip(INPUTS, ours, strict=True):
        got = np.asarray(got)
        ref = unit(hf_last_hidden(qwen3, tuple(ids)))
        assert abs(np.linalg.norm(got) - 1.0) < 1e-5  # normalised
        assert float(got @ ref) >= 0.9999, f"{len(ids)} tokens"
        np.testing.assert_allclose(got, ref, atol=1e-4)


def test_dimensions_truncate_then_normalise(qwen3: Path, engine_binding: Any) -> None:
    ctx = context(engine_binding, qwen3)
    full = np.asarray(engine_binding.embed(ctx, INPUTS[:2])[1])
    cut = np.asarray(engine_binding.embed(ctx, INPUTS[:2], 16)[1])
    assert cut.shape == (16,)
    np.testing.assert_allclose(cut, unit(full[:16]), atol=1e-6)


def test_batched_is_bit_identical_to_alone_on_the_deployed_path(
    smollm2_checkpoint: Path, engine_binding: Any
) -> None:
    """Packed side by side in one cache (bf16 KV, the fast kernels), no input sees another:
    inputs of >= 16 tokens (prefill kernels alone too) get the same bits as one at a time."""
    ctx = context(engine_binding, smollm2_checkpoint, 128, precision="fast")
    inputs = [INPUTS[2], INPUTS[3], [7000 + i for i in range(20)]]
    batched = engine_binding.embed(ctx, inputs)
    for ids, got in zip(inputs, batched, strict=True):
        assert engine_binding.embed(ctx, [ids])[0] == got


def hf_rerank_ids(model_dir: Path, document: str) -> list[int]:
    """The model card's tokens: prefix, the formatted pair and suffix tokenized apart, joined.
    The pair is plain text here (split_special_tokens): marker text in it stays text."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    pair = f"<Instruct>: {RERANK_INSTRUCTION}\n<Query>: {QUERY}\n<Document>: {document}"
    return (
        tokenizer.encode(RERANK_PREFIX, add_special_tokens=False)
        + tokenizer.encode(pair, add_special_tokens=False, split_special_tokens=True)
        + tokenizer.encode(RERANK_SUFFIX, add_special_tokens=False)
    )


def test_rerank_prompt_is_the_model_cards(qwen3: Path, engine_binding: Any) -> None:
    tok = engine_binding.Model()
    tok.setup(str(qwen3), threads=1, max_context=64)
    for doc in DOCUMENTS:
        assert engine_binding.rerank_prompt(tok.tokenizer, QUERY, doc) == hf_rerank_ids(qwen3, doc)


def test_rerank_score_is_hf_p_yes(qwen3: Path, engine_binding: Any) -> None:
    ctx = context(engine_binding, qwen3, 512)
    scores = engine_binding.rerank_scores(ctx, QUERY, DOCUMENTS)
    ranked, prompt_tokens = engine_binding.rerank(ctx, QUERY, DOCUMENTS)
    model = transformers.AutoModelForCausalLM.from_pretrained(qwen3, dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(qwen3)
    yes, no = tokenizer.convert_tokens_to_ids("yes"), tokenizer.convert_tokens_to_ids("no")
    total = 0
    for doc, got in zip(DOCUMENTS, scores, strict=True):
        ids = hf_rerank_ids(qwen3, doc)
        total += len(ids)
        with torch.no_grad():
            last = model(torch.tensor([ids])).logits[0, -1]
        p_yes = torch.softmax(torch.stack([last[no], last[yes]]), 0)[1].item()
        assert abs(got - p_yes) <= 1e-4, doc
    assert prompt_tokens == total
    assert len(set(scores)) == len(scores)  # the documents are told apart
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    assert ranked == [{"index": i, "relevance_score": scores[i]} for i in order]
    assert engine_binding.rerank(ctx, QUERY, DOCUMENTS, 2)[0] == ranked[:2]
    assert engine_binding.rerank(ctx, QUERY, DOCUMENTS, 9)[0] == ranked  # more than there are


@pytest.mark.parametrize(
    ("inputs", "dimensions", "message"),
    [
        ([], None, "no inputs: give at least one"),
        ([[5], []], None, "input 1 is empty (no tokens)"),
        ([[5] * 65], None, "input 0 has 65 tokens, more than the context of 64"),
        ([[5]] * 2049, None, "2049 inputs: at most 2048 per request"),
        ([[5, 49152]], None, "token id 49152 is outside the vocabulary"),
        ([[5]], 0, "dimensions 0 is outside [1, 64] (the model's hidden size)"),
        ([[5]], 65, "dimensions 65 is outside [1, 64] (the model's hidden size)"),
    ],
)
def test_embed_bounds(
    qwen3: Path, engine_binding: Any, inputs: list[list[int]], dimensions: int, message: str
) -> None:
    ctx = context(engine_binding, qwen3)
    with pytest.raises(engine_binding.Error) as e:
        engine_binding.embed(ctx, inputs, dimensions)
    assert str(e.value) == message


def without_yes(model_dir: Path) -> Path:
    """The fixture with its "yes" token renamed, and the merges that make or use it dropped."""
    path = model_dir / "tokenizer.json"
    tok = json.loads(path.read_text())
    vocab = tok["model"]["vocab"]
    vocab["yes-renamed"] = vocab.pop("yes")
    merges = [m.split(" ") if isinstance(m, str) else m for m in tok["model"]["merges"]]
    tok["model"]["merges"] = [m for m in merges if "yes" not in m and "".join(m) != "yes"]
    path.write_text(json.dumps(tok))
    return model_dir


def test_rerank_refuses_a_vocabulary_without_yes(family_fixture: Any, engine_binding: Any) -> None:
    ctx = context(engine_binding, without_yes(family_fixture("qwen3-tiny")))
    with pytest.raises(engine_binding.Error, match='no "yes" or "no" token'):
        engine_binding.rerank(ctx, QUERY, DOCUMENTS)


def test_last_token_logits_bounds(qwen3: Path, engine_binding: Any) -> None:
    ctx = context(engine_binding, qwen3)
    with pytest.raises(engine_binding.Error, match="^token id 49152 is outside the vocabulary$"):
        engine_binding.last_token_logits(ctx, [[5]], [1, 49152])
    with pytest.raises(engine_binding.Error, match="^input 0 is empty"):
        engine_binding.last_token_logits(ctx, [[]], [1])


def test_rerank_bounds(qwen3: Path, engine_binding: Any) -> None:
    ctx = context(engine_binding, qwen3)
    with pytest.raises(engine_binding.Error, match="^no documents: give at least one$"):
        engine_binding.rerank(ctx, QUERY, [])
    with pytest.raises(engine_binding.Error, match="^2049 documents: at most 2048 per request$"):
        engine_binding.rerank(ctx, QUERY, ["d"] * 2049)
    with pytest.raises(engine_binding.Error, match="^input 0 has .* more than the context of 64$"):
        engine_binding.rerank(ctx, QUERY, ["long " * 100])
    with pytest.raises(engine_binding.Error, match="^top_n 0 must be >= 1$"):
        engine_binding.rerank(ctx, QUERY, DOCUMENTS, 0)


def test_llm_embed_and_rerank(qwen3: Path, edgellm_package: Any, engine_binding: Any) -> None:
    llm = edgellm_package.load(str(qwen3), precision="exact", max_context=512)
    texts = ["hello world", "a longer sentence about embeddings"]
    got = llm.embed(texts)
    ctx = context(engine_binding, qwen3, 512)
    ids = [llm.tokenize(t) for t in texts]
    assert got == engine_binding.embed(ctx, ids)
    assert llm.embed(texts[0], dimensions=8) == engine_binding.embed(ctx, ids[:1], 8)
    assert (
        llm.rerank(QUERY, DOCUMENTS, top_n=2) == engine_binding.rerank(ctx, QUERY, DOCUMENTS, 2)[0]
    )
    with pytest.raises(edgellm_package.Error, match="^top_n 0 must be >= 1$"):
        llm.rerank(QUERY, DOCUMENTS, top_n=0)


# --- edgellm serve ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(qwen3: Path) -> Any:
    s = Server(qwen3, "--exact", max_context=512)
    yield s
    assert s.stop() == 0


def model_name(server: Server) -> str:
    return json.loads(server.get("/v1/models")[1])["data"][0]["id"]


def test_openai_client_embeddings(served: Server, qwen3: Path, engine_binding: Any) -> None:
    texts = ["hello world", "the quick brown fox", "x"]
    name = model_name(served)
    reply = served.client.embeddings.create(model=name, input=texts)  # asks for base64
    ctx = context(engine_binding, qwen3, 512)
    tok = engine_binding.Model()
    tok.setup(str(qwen3), threads=1, max_context=64)
    ids = [tok.tokenizer.encode(t, True) for t in texts]
    ours = engine_binding.embed(ctx, ids)
    assert [d.index for d in reply.data] == [0, 1, 2]
    for d, ref in zip(reply.data, ours, strict=True):
        assert d.embedding == pytest.approx(ref, abs=0)
    assert reply.model == name
    assert reply.usage.prompt_tokens == reply.usage.total_tokens == sum(map(len, ids))
    short = served.client.embeddings.create(model=name, input=texts[0], dimensions=10)
    assert short.data[0].embedding == pytest.approx(unit(np.asarray(ours[0][:10])), abs=1e-6)


def test_embeddings_float_and_base64(served: Server) -> None:
    name = model_name(served)
    body = {"model": name, "input": [[5, 6, 7], "hi"], "user": "u1"}
    status, floats = served.post_json("/v1/embeddings", {**body, "encoding_format": "float"})
    assert status == 200, floats
    assert floats["object"] == "list" and floats["data"][1]["object"] == "embedding"
    status, b64 = served.post_json("/v1/embeddings", {**body, "encoding_format": "base64"})
    assert status == 200, b64
    for f, b in zip(floats["data"], b64["data"], strict=True):
        decoded = np.frombuffer(base64.b64decode(b["embedding"]), dtype="<f4")
        assert decoded.tolist() == pytest.approx(f["embedding"], abs=0)
    status, one = served.post_json("/v1/embeddings", {"model": name, "input": [5, 6, 7]})
    assert status == 200 and one["data"][0]["embedding"] == floats["data"][0]["embedding"]


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"input": "a", "pooling": "mean"}, "pooling", "unsupported field 'pooling'"),
        ({}, "input", "missing required field 'input'"),
        ({"input": 5}, "input", "'input' must be a string, a list of strings, or"),
        ({"input": [["a"]]}, "input", "'input' must be a string, a list of strings, or"),
        ({"input": {"a": "b"}}, "input", "'input' must be a string, a list of strings, or"),
        ({"input": ["a"] * 2049}, "input", "2049 inputs: at most 2048 per request"),
        ({"input": "a", "dimensions": 1.5}, "dimensions", "'dimensions' must be an integer"),
        ({"input": "a", "dimensions": 0}, None, "dimensions 0 is outside [1, 64]"),
        ({"input": "a", "dimensions": 65}, None, "dimensions 65 is outside [1, 64]"),
        ({"input": "a", "encoding_format": "int8"}, "encoding_format", 'must be "float" or'),
        ({"input": "a", "user": 5}, "user", "'user' must be a string"),
        ({"input": ""}, None, "input 0 is empty (no tokens)"),
        ({"input": [[5] * 513]}, None, "input 0 has 513 tokens, more than the context of 512"),
        ({"input": [[49152]]}, None, "token id 49152 is outside the vocabulary"),
    ],
)
def test_embeddings_refusals(
    served: Server, body: dict[str, Any], param: Any, message: str
) -> None:
    status, reply = served.post_json("/v1/embeddings", {"model": model_name(served), **body})
    assert status == 400, reply
    assert message in reply["error"]["message"]
    assert reply["error"]["param"] == param


def test_rerank_route(served: Server, qwen3: Path, engine_binding: Any) -> None:
    ctx = context(engine_binding, qwen3, 512)
    ranked, tokens = engine_binding.rerank(ctx, QUERY, DOCUMENTS)
    body = {"model": model_name(served), "query": QUERY, "documents": DOCUMENTS}
    status, reply = served.post_json("/v1/rerank", body)
    assert status == 200, reply
    scores = reply["results"]
    assert scores == ranked  # float32 printed and read back exactly
    assert [r["relevance_score"] for r in scores] == sorted(
        (r["relevance_score"] for r in scores), reverse=True
    )
    assert reply["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    status, top = served.post_json("/v1/rerank", {**body, "top_n": 1})
    assert status == 200 and top["results"] == reply["results"][:1]


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"return_documents": True}, "return_documents", "unsupported field 'return_documents'"),
        ({"query": None}, "query", "missing required field 'query'"),
        ({"query": 5}, "query", "'query' must be a string"),
        ({"documents": None}, "documents", "missing required field 'documents'"),
        ({"documents": ["a", 5]}, "documents", "'documents' must be a list of strings"),
        ({"top_n": 1.5}, "top_n", "'top_n' must be an integer"),
        ({"top_n": 0}, None, "top_n 0 must be >= 1"),
        ({"documents": []}, None, "no documents: give at least one"),
    ],
)
def test_rerank_refusals(served: Server, body: dict[str, Any], param: Any, message: str) -> None:
    full = {"model": model_name(served), "query": QUERY, "documents": DOCUMENTS, **body}
    status, reply = served.post_json("/v1/rerank", {k: v for k, v in full.items() if v is not None})
    assert status == 400, reply
    assert message in reply["error"]["message"]
    assert reply["error"]["param"] == param
