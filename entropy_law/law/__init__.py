"""The entropy law (analysis layer): at-risk tables, law families, tests, predictions, cost model.

numpy / scipy / pandas / statsmodels only; never imports torch.
"""
