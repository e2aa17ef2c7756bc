"""What the launcher decides and hands the ranks: the train spec (`spec`), the ranks a node runs (`world`), the
torchrun job itself (`torchrun`), a job that ends with its launcher (`lifetime`), and what the ranks trained, as
rank 0 writes it and the launcher reads it back (`summary`).

A rank imports `spec`, `world`, `lifetime` and `summary`; nothing here imports a rank's training code."""
