"""What a day trains with, decided before torchrun starts: the optim values for its size (`recipe`), a small
day's searched `sparse_lr` (`sparse_lr_search`, `day_recipe`), the parent's eval rows it trains first
(`parent_eval`), from the model it starts from (`published`).  The flow calls these; nothing here imports it."""
