"""The text job of the peers benchmark (issue 21): fine-tune the same tiny BERT, anytrain against the HF Trainer.

Who speaks in the bundled shakespeare-speakers set (8 speakers; 908 / 125 / 255 speeches, written
to parquet by peers_bench.py), a BERT of 4 layers x 128 (4 heads, 512 intermediate, dropout 0.1)
with a 2,000-token WordPiece tokenizer trained on the training speeches, built once from a seed and
saved with save_pretrained; texts cut at 128 tokens and padded per batch; batch 32, AdamW (lr 1e-3,
weight decay 0.01 on matrices and embeddings, not biases and LayerNorms), constant LR without warm-up,
gradient norm clipped to 1.0, fp32, 3 epochs (87 steps), validation and a checkpoint at every epoch
end, a test pass at the end, the training loss logged every 10 steps, 1 process.
"""  # the second paragraph is the job's description in docs/benchmarks.md

from pathlib import Path

MAX_LENGTH, BATCH, EPOCHS, LR, WEIGHT_DECAY, MAX_GRAD_NORM, LOG_EVERY, SEED = 128, 32, 3, 1e-3, 0.01, 1.0, 10, 42
TEXT, LABEL = "text", "speaker"

# The same job as anytrain options (src/train.py), given --model hf:FOLDER and --dataset DIR.
ANYTRAIN_OPTIONS = ["--text-column", TEXT, "--label-column", LABEL, "--max-length", str(MAX_LENGTH)]
ANYTRAIN_OPTIONS += ["--batch-size", str(BATCH), "--epochs", str(EPOCHS), "--lr", str(LR)]
ANYTRAIN_OPTIONS += ["--weight-decay", str(WEIGHT_DECAY), "--max-grad-norm", str(MAX_GRAD_NORM), "--seed", str(SEED)]
ANYTRAIN_OPTIONS += ["--schedule", "constant", "--warmup-steps", "0", "--log-every-steps", str(LOG_EVERY)]


def build_bert(folder: Path, train_texts: list[str]) -> Path:
    """The tiny BERT and its WordPiece tokenizer (trained on train_texts), saved to folder once."""
    if (folder / "config.json").exists():
        return folder
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(train_texts, trainers.WordPieceTrainer(vocab_size=2000, special_tokens=specials))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    names = dict(unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, **names)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=512,
        max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(SEED)
    BertForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
