"""Data: every source read with Hugging Face `datasets`, checked, split and held the fastest way.

    sources    where data comes from: names and paths opened, splits named and carved, paths sniffed
    splits     Splits, the one type every task's loading returns, and the DataLoader of a split
    tables     labelled tables (classify, regress, multilabel): in memory, or via arrow/images/stream
    targets    what label columns become for regress and multilabel
    text       text to model as token windows (lm); textcls: text to classify; hftext: for a transformers model
    tokenizer  characters, bytes and BPE: every tokenizer a run makes
    images, arrow, stream, speakers   images decoded per batch, big tables in Arrow, streams, the bundled speakers

Nothing here imports tasks/: a task's module calls the loader it needs (layering: tasks -> data -> config).
"""
