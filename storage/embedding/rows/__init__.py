"""The row layer every tier shares: a row's stored form (`format`) and update rules (`sparse_optim`), its 8-bit
codes (`quantize`) and stochastic rounding (`rounding`), its initial value (`initial`), and batches of rows
(`batch`), their buffers (`buffer`), argument checks (`checks`), sums by key (`segments`) and device copies
(`transfer`)."""
