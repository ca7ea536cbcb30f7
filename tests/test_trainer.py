"""`transformers.Trainer` trains a model prepared by monet as it trains the model itself: a small
data set of token sequences of varying length made here (no download), the Trainer's
language-model collator padding each batch to its longest sequence, gradient accumulation over
two micro-batches; every micro-batch runs through the schedule, at several lengths, and the
logged losses and the weights after every optimizer step equal plain Trainer's, bitwise (normal
mode).  The recipe is docs/guide.md's ("Language models")."""
from __future__ import annotations

import random

import pytest
from ci import skip_unless_long
import torch

from reach_models import missing

pytestmark = pytest.mark.skipif(missing("transformers") is not None, reason=str(missing("transformers")))

VOCAB, LONGEST, EXAMPLES = 64, 24, 24


def _tokenizer():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1, **{f"t{i}": i for i in range(2, VOCAB)}}
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="[UNK]")),
                                   pad_token="[PAD]", unk_token="[UNK]")


def _dataset():
    rng = random.Random(0)
    return [{"input_ids": [rng.randrange(2, VOCAB) for _ in range(rng.randrange(5, LONGEST + 1))]}
            for _ in range(EXAMPLES)]


def _model():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=2,
                                      bos_token_id=0, eos_token_id=0, pad_token_id=0))


def _train(model, tmp_path, collator, bf16: bool, weights_of, steps=4):
    """(logged losses, ``weights_of``'s parameters by name after each optimizer step) of ``steps``
    steps of the Trainer on ``model``."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    class Weights(TrainerCallback):
        def __init__(self):
            self.after = []

        def on_step_end(self, args, state, control, **kw):
            self.after.append({n: p.detach().clone() for n, p in weights_of.named_parameters()})


    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, gradient_accumulation_steps=2,
                             bf16=bf16,
                             max_steps=steps, learning_rate=1e-3, logging_steps=1, use_cpu=True, report_to=[],
                             seed=0, save_strategy="no", dataloader_num_workers=0, disable_tqdm=True,
                             remove_unused_columns=False)  # the wrapper's forward(*args, **kwargs) names no column
    weights = Weights()
    trainer = Trainer(model=model, args=args, train_dataset=_dataset(), data_collator=collator, callbacks=[weights])
    trainer.train()
    return [h["loss"] for h in trainer.state.log_history if "loss" in h], weights.after


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_trainer_losses_and_weights_equal_plain_trainers(tmp_path, bf16):
    """fp32, and bf16 autocast on the CPU (the Trainer's ``bf16=True``; the schedule solved for it,
    ``autocast_dtype=torch.bfloat16``): recomputation only, so the same arithmetic either way."""
    if bf16:
        skip_unless_long("the Trainer's bf16 path", 35, "in the short suite, tests/test_mixed_precision.py runs the wrapper under bf16 "
                   "autocast, without the Trainer")
    import monet
    from transformers import DataCollatorForLanguageModeling

    collator = DataCollatorForLanguageModeling(tokenizer=_tokenizer(), mlm=False)
    plain, model = _model(), _model()
    # the Trainer's call: the collator's batch, padded to the longest sequence, and the tokens the
    # loss counts (num_items_in_batch: it passes it to a model that takes loss arguments)
    longest = collator([{"input_ids": list(range(2, 2 + LONGEST))}] * 4)
    example = {**longest, "num_items_in_batch": torch.tensor(float(4 * (LONGEST - 1)))}
    wrapped = monet.optimize(model, example, budget="70%", buckets=[LONGEST], cost="analytic", time_limit=5,
                             progress=False, autocast_dtype=torch.bfloat16 if bf16 else None)
    assert wrapped.solutions[LONGEST].schedule.recompute_count() > 0
    assert wrapped.loss_type == plain.loss_type and wrapped.config is model.config  # what Trainer reads
    scheduled, lengths = wrapped.wrappers[LONGEST], []
    run = scheduled._scheduled  # the schedule's step: recorded, then run

    def recorded(*args, **kwargs):
        lengths.append(kwargs["input_ids"].shape[1])
        return run(*args, **kwargs)

    scheduled._scheduled = recorded
    losses_plain, weights_plain = _train(plain, tmp_path / "plain", collator, bf16, plain)
    losses_monet, weights_monet = _train(wrapped, tmp_path / "monet", collator, bf16, model)
    assert len(losses_plain) == 4 and len(weights_plain) == 4
    assert len(lengths) == 4 * 2 and len(set(lengths)) > 1  # every micro-batch, padded to its own longest
    # bf16 too: the captured graph's dropout and its backward's dtypes are eager PyTorch's
    # (monet.impls.dropout.match_eager_dropout, compat.eager_backward_autocast)
    assert losses_monet == losses_plain
    for mine, theirs in zip(weights_monet, weights_plain, strict=True):
        assert mine.keys() == theirs.keys() and all(torch.equal(mine[n], theirs[n]) for n in theirs)
