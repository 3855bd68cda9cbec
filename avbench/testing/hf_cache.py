"""A local Hugging Face cache holding config-only stand-ins for the seed pairs' checkpoints.

The seed pairs name checkpoints of hundreds of GB that no test machine has. What vLLM reads
before loading weights (``config.json``, the tokenizer) is small, so each repository gets a
snapshot in the hub's own cache layout (``models--org--name/refs/main`` and
``snapshots/<revision>/``) with a config of the real architecture and model type, a few layers,
and the shipped tiny pair's tokenizer. With ``HF_HOME`` pointing at it and the hub offline,
vLLM resolves the pairs' ids exactly as on a machine that downloaded them, and avbench resolves
sub-folder drafters (``avbench.inputs.checkpoints``) to a directory inside a snapshot.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

REVISION = "0" * 40
_TOKENIZER = Path(__file__).resolve().parent.parent / "assets" / "tiny" / "target"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
VOCAB = 2048  # the tiny tokenizer's


def add_snapshot(hub: Path, repo: str, configs: dict[str, dict]) -> Path:
    """Write ``repo``'s snapshot under ``hub`` (``$HF_HOME/hub``): each ``configs`` key is a
    folder of the repository ("" for its root) that gets that config.json and a tokenizer."""
    base = hub / f"models--{repo.replace('/', '--')}"
    (base / "refs").mkdir(parents=True, exist_ok=True)
    (base / "refs" / "main").write_text(REVISION)
    snapshot = base / "snapshots" / REVISION
    for folder, config in configs.items():
        where = snapshot / folder
        where.mkdir(parents=True, exist_ok=True)
        (where / "config.json").write_text(json.dumps(config, indent=1))
        for name in _TOKENIZER_FILES:
            shutil.copy(_TOKENIZER / name, where / name)
    return snapshot


def _tiny(config_cls, architecture: str, **fields) -> dict:
    """A transformers config class's defaults, shrunk to two layers and the tiny vocabulary."""
    config = config_cls(vocab_size=VOCAB, num_hidden_layers=2, **fields).to_dict()
    return config | {"architectures": [architecture]}


def seed_configs() -> dict[str, dict[str, dict]]:
    """Repository id -> {folder: config.json} for every checkpoint the seed pairs name."""
    import transformers as tf  # lazy: only the config modules named below are imported

    dflash = {"target_layer_ids": [0, 1], "mask_token_id": 5}
    # Muse keeps its full configs: the assistant's token ids refer to the target's vocabulary.
    assistant = tf.MuseGlimmerAssistantConfig().to_dict()
    return {
        "deepseek-ai/DeepSeek-V4-Flash-0731": {
            # DSpark drafts from stages inside the target checkpoint (no separate drafter).
            "": _tiny(tf.DeepseekV4Config, "DeepseekV4ForCausalLM", num_nextn_predict_layers=1),
        },
        "XiaomiMiMo/MiMo-V2.5-Pro-FP4-DFlash": {
            "": _tiny(tf.MiMoV2FlashConfig, "MiMoV2ForCausalLM"),
            # The DFlash drafter ships as a folder of the target's repository.
            "dflash": _tiny(tf.Qwen3Config, "DFlashDraftModel", dflash_config=dflash),
        },
        "thinkingmachines/Inkling-NVFP4": {
            # vLLM's own Inkling config (model_type inkling_model); MTP heads in mtp_config.
            "": {
                "model_type": "inkling_model",
                "architectures": ["InklingForCausalLM"],
                "vocab_size": VOCAB,
                "hidden_size": 256,
                "intermediate_size": 256,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "mtp_config": {"num_nextn_predict_layers": 3},
            },
        },
        "meta-models/Muse-Glimmer-30B": {
            "": tf.MuseGlimmerConfig().to_dict()
            | {"architectures": ["MuseGlimmerForConditionalGeneration"]},
        },
        "meta-models/Muse-Glimmer-30B-assistant": {
            "": assistant | {"architectures": ["MuseGlimmerAssistantModel"]},
        },
    }


def seed_cache(hf_home: Path) -> Path:
    """Fill ``hf_home`` (a fresh ``HF_HOME``) with every seed checkpoint; returns its hub dir."""
    hub = hf_home / "hub"
    for repo, configs in seed_configs().items():
        add_snapshot(hub, repo, configs)
    return hub
