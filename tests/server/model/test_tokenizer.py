"""Tokenizer and chat template agree with transformers on the same files."""

from __future__ import annotations

import json

import pytest
from flotilla_server.model.tokenizer import ChatTemplateError, Tokenizer

from tests.support.hf_models import BOS_ID, EOS_ID, write_tokenizer_files

TEXTS = ["Hello, world!", "", "  leading spaces and\nnew lines\t", "héllo wörld — ünïcode ✓ 日本語 🙂",
         "<s>special in text</s>", "the queue depth of the operator"]
CONVERSATIONS = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3? ✓"}],
]


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok")
    write_tokenizer_files(path)
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [EOS_ID, 383]}))
    return path


@pytest.fixture(scope="module")
def hf_tok(tok_dir):
    import transformers

    return transformers.AutoTokenizer.from_pretrained(tok_dir)


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_encode_decode_match_transformers(tok_dir, hf_tok, text, add_special_tokens):
    tok = Tokenizer.from_dir(tok_dir)
    ids = tok.encode(text, add_special_tokens=add_special_tokens)
    assert ids == hf_tok.encode(text, add_special_tokens=add_special_tokens)
    assert tok.decode(ids) == hf_tok.decode(ids, skip_special_tokens=True)
    assert tok.decode(ids, skip_special_tokens=False) == hf_tok.decode(ids, skip_special_tokens=False)


def test_bos_is_added_by_the_post_processor(tok_dir):
    tok = Tokenizer.from_dir(tok_dir)
    assert tok.encode("x")[0] == BOS_ID
    assert tok.encode("x", add_special_tokens=False)[0] != BOS_ID


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(tok_dir, hf_tok, messages, add_generation_prompt):
    tok = Tokenizer.from_dir(tok_dir)
    text = tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    expected = hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert text == expected
    assert text.startswith("<s>")  # the template's bos_token variable is bound
    ids = hf_tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert tok.encode(text, add_special_tokens=False) == list(ids)


def test_template_raise_exception_becomes_a_chat_template_error(tok_dir):
    tok = Tokenizer.from_dir(tok_dir)
    with pytest.raises(ChatTemplateError, match="role must be system, user or assistant, got tool"):
        tok.apply_chat_template([{"role": "tool", "content": "x"}])


def test_template_is_sandboxed(tok_dir, tmp_path):
    write_tokenizer_files(tmp_path)
    (tmp_path / "chat_template.jinja").write_text("{{ messages.__class__.__mro__ }}")
    with pytest.raises(ChatTemplateError):
        Tokenizer.from_dir(tmp_path).apply_chat_template(CONVERSATIONS[0])


def test_chat_template_jinja_file_and_named_templates(tmp_path):
    write_tokenizer_files(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "tool_use", "template": "T"},
                               {"name": "default", "template": "{{ eos_token }}{{ messages | tojson }}"}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    assert Tokenizer.from_dir(tmp_path).apply_chat_template([{"role": "user", "content": "é"}]) == (
        '</s>[{"role": "user", "content": "é"}]'
    )
    (tmp_path / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}{% break %}{% endfor %}")
    assert Tokenizer.from_dir(tmp_path).apply_chat_template(CONVERSATIONS[1]) == "Be brief."


def test_no_chat_template_says_what_to_do(tmp_path):
    write_tokenizer_files(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ChatTemplateError, match="no chat template"):
        Tokenizer.from_dir(tmp_path).apply_chat_template(CONVERSATIONS[0])


def test_eos_ids_gather_generation_config_config_and_tokenizer(tok_dir):
    tok = Tokenizer.from_dir(tok_dir, extra_eos_token_ids=[7])
    assert tok.eos_token_ids == frozenset({EOS_ID, 383, 7})


def test_missing_tokenizer_json_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"tokenizer\.json not found"):
        Tokenizer.from_dir(tmp_path)


def test_absent_special_tokens_render_empty_like_transformers(tmp_path):
    write_tokenizer_files(tmp_path)
    (tmp_path / "chat_template.jinja").write_text("[{{ pad_token }}|{{ eos_token }}]")
    assert Tokenizer.from_dir(tmp_path).apply_chat_template(CONVERSATIONS[0]) == "[|</s>]"
