"""The companion: a Poly2 LR fit beside the network on every row so far, its logit blended into every score.

`model.companion`: `auto` (the default) on a small day with own keys (`trainer.companion.fit.why_none`), `poly2`
on every day.  After a day's training rank 0 fits it (`trainer.companion.fit.fit_for_spec`) on the newest
`model.companion_rows` rows of, oldest first: the rows the parent's companion was fit on, the parent's eval rows,
and the day's train rows.  The day's eval rows never: the gate scores the model on them; so no source of the
day's date or later but its train rows (a rerun's parent is the same date's model).  The row sources follow the
model's lineage (model.json `companion.sources`), so the fit depends on the run's inputs
(`TrainSpec.identity`: the features, the model started from, the model config) and on which of those rows are
still on disk (a source deleted since is skipped and named: `trainer.companion.rows.read_rows`).  Its C is
chosen by cross-validation of the rows (`trainer.companion.poly2.fit_cv`), and kept by the days after
(`trainer.companion.fit.kept_c`) until their rows double or a week of fits has used it: a kept C is one fit,
where the choice makes six or more before that one (three folds, two Cs at the fewest).

Why a second learner: on small days the mean of the network's logit and a converged, strongly regularised
Poly2 fit of every row so far gains over the network alone on both real samples, where no change inside the
network did (issue 31, `docs/reports/2026-12-05-companion.md`).  Its inputs are the values' own keys, admitted
or not (`r_<j>`, written with `encode.raw_keys`; a bag field's first value): a value too rare for a row of the
network's still gets a weight, and its pairs theirs, as a hashed LR's do; the log1p dense columns, bucketed
(`trainer.companion.poly2`); and each key's count class in the fit rows (`trainer.companion.key_counts`), so a
value too rare for a weight of its own still says how rare it is.

Stored as `companion.safetensors` (the weights, and the fit rows' key counts a scorer counts against) in the
model directory and the serving bundle (`trainer.companion.file`); every scorer blends through
`trainer.eval.scoring.score_arrays`, at the network's weight model.json's record states (`blend_weight`, from
`model.companion_blend_weight`; 0.5 in a record from before it).  The record also says how the fit stopped
(`convergence`), and a fit that stops short of the tolerance warns.  A model with a companion is written as
model.json version 4, which releases that cannot blend it with its counts refuse (`trainer.model_dir.MODEL`).

The modules, one responsibility each: `model` (the companion as a scorer uses it: its inputs, logits and the
blend), `file` (its safetensors file), `rows` (the rows of its lineage it is fit on), `fit` (whether a day gets
one, its C, the fit and its record), `poly2` (the learner) and `key_counts` (its count classes).
"""
