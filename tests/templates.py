"""Chat templates written here after the public templates of model families (the Jinja each family's tokenizer
ships, simplified where it handles tools), for the tests that find the answers in rendered chats. Each entry:
the template, its bos and eos tokens, and the markers it needs as special tokens.

    chatml      Qwen 2, SmolLM: <|im_start|>role ... <|im_end|>
    llama3      Llama 3: headers, <|eot_id|> after each turn
    llama2      Llama 2: [INST] <<SYS>> ... [/INST] answer </s>, bos before each user turn
    mistral     Mistral: [INST] ... [/INST]answer</s>, the system text before the first question
    phi3        Phi-3: <|user|> ... <|end|>, and the end-of-text token closing a chat without a generation prompt
    gemma       Gemma: <start_of_turn>user / model ... <end_of_turn>, the system text in the first user turn
    zephyr      Zephyr: <|role|> ... </s>
    vicuna      Vicuna: USER: ... ASSISTANT: ...</s>
    qwen3       Qwen 3: reasoning (<think> ... </think>) kept for the answers after the last question only
    r1          DeepSeek-R1: reasoning dropped from every answer, the generation prompt opening a new <think>
"""

from __future__ import annotations

SPECIALS = [
    "<|im_start|>",
    "<|im_end|>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "[INST]",
    "[/INST]",
    "<s>",
    "</s>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|end|>",
    "<bos>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<think>",
    "</think>",
]

TEMPLATES = {
    "chatml": (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
        "<|endoftext|>",
        "<|im_end|>",
    ),
    "llama3": (
        "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
        "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
        "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}",
        "<|begin_of_text|>",
        "<|eot_id|>",
    ),
    "llama2": (
        "{% if messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}"
        "{% set turns = messages[1:] %}{% else %}{% set system = '' %}{% set turns = messages %}{% endif %}"
        "{% for m in turns %}{% if m['role'] == 'user' %}{{ bos_token }}[INST] "
        "{% if loop.first and system %}<<SYS>>\n{{ system }}\n<</SYS>>\n\n{% endif %}{{ m['content'] | trim }} [/INST]"
        "{% else %} {{ m['content'] | trim }} {{ eos_token }}{% endif %}{% endfor %}",
        "<s>",
        "</s>",
    ),
    "mistral": (
        "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] + '\n\n' %}"
        "{% set turns = messages[1:] %}{% else %}{% set system = '' %}{% set turns = messages %}{% endif %}"
        "{% for m in turns %}{% if m['role'] == 'user' %}[INST] {% if loop.first %}{{ system }}{% endif %}"
        "{{ m['content'] }} [/INST]{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}",
        "<s>",
        "</s>",
    ),
    "phi3": (
        "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% else %}{{ eos_token }}{% endif %}",
        "<|endoftext|>",
        "<|endoftext|>",
    ),
    "gemma": (
        "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set first = messages[0]['content'] + '\n\n' %}"
        "{% set turns = messages[1:] %}{% else %}{% set first = '' %}{% set turns = messages %}{% endif %}"
        "{% for m in turns %}{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
        "<start_of_turn>{{ role }}\n{% if loop.first %}{{ first }}{% endif %}{{ m['content'] | trim }}<end_of_turn>\n"
        "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}",
        "<bos>",
        "<eos>",
    ),
    "zephyr": (
        "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}",
        "<s>",
        "</s>",
    ),
    "vicuna": (
        "{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] }} {% elif m['role'] == 'user' %}"
        "USER: {{ m['content'] }} {% else %}ASSISTANT: {{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}ASSISTANT:{% endif %}",
        "<s>",
        "</s>",
    ),
    "qwen3": (
        "{% set ns = namespace(last=-1) %}{% for m in messages %}{% if m['role'] == 'user' %}"
        "{% set ns.last = loop.index0 %}{% endif %}{% endfor %}"
        "{% for m in messages %}{% set content = m['content'] %}"
        "{% if m['role'] == 'assistant' and '</think>' in content %}"
        "{% set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\n') %}"
        "{% set content = content.split('</think>')[-1].lstrip('\n') %}"
        "{% if loop.index0 > ns.last %}{% set content = '<think>\n' + reasoning + '\n</think>\n\n' + content %}"
        "{% endif %}{% endif %}<|im_start|>{{ m['role'] }}\n{{ content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
        "<|endoftext|>",
        "<|im_end|>",
    ),
    "r1": (
        "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] }}"
        "{% elif m['role'] == 'user' %}<|user|>{{ m['content'] }}"
        "{% else %}<|assistant|>{{ m['content'].split('</think>')[-1] }}{{ eos_token }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|><think>\n{% endif %}",
        "<s>",
        "</s>",
    ),
}


def templated_tokenizer(name: str):
    """The tests' GPT-2 tokenizer (tests/hfmodels.py) with every template's markers as special tokens, and the
    template `name` with its bos and eos tokens."""
    from hfmodels import gpt2_tokenizer

    template, bos, eos = TEMPLATES[name]
    tokenizer = gpt2_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": [*SPECIALS, "<eos>"]})
    tokenizer.chat_template, tokenizer.bos_token, tokenizer.eos_token = template, bos, eos
    return tokenizer
