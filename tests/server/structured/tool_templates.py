"""Chat templates that take `tools`, written for these tests in the two shapes real ones have: Hermes/Qwen
(`<tools>` in the system turn, `<tool_call>` blocks, a `tool` role as `<tool_response>`) and Llama 3.1
(the functions as JSON in the system turn, calls as `{"name", "parameters"}`, results as `ipython` turns)."""

from __future__ import annotations

import json
from pathlib import Path

HERMES_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nYou may call functions.\n<tools>\n{%- for t in tools %}\n{{ t.function | tojson }}"
    "{%- endfor %}\n</tools>\nReturn each call in <tool_call></tool_call> tags.<|im_end|>\n{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{%- elif m.tool_calls %}<|im_start|>assistant\n{%- for c in m.tool_calls %}\n<tool_call>\n"
    '{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}\n</tool_call>'
    "{%- endfor %}<|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")

LLAMA3_TEMPLATE = (
    "{%- if tools %}<|start_header_id|>system<|end_header_id|>\nYou may call a function: respond with JSON "
    '{"name": function name, "parameters": its arguments}.\n{%- for t in tools %}\n{{ t | tojson }}{%- endfor %}'
    "<|eot_id|>{%- endif %}"
    "{%- for m in messages %}<|start_header_id|>{{ 'ipython' if m.role == 'tool' else m.role }}<|end_header_id|>\n"
    "{{ m.content }}<|eot_id|>{%- endfor %}"
    "{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n{%- endif %}")


def with_template(model_dir: Path, template: str) -> Path:
    config_path = model_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = template
    config_path.write_text(json.dumps(config))
    return model_dir
