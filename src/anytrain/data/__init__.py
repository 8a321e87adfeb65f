"""Data: every source read with Hugging Face `datasets`, checked, split and held the fastest way.

    sources    where data comes from: names and paths opened, splits named and carved, paths sniffed
    describe   a description of the data, read once, that --task auto asks each task about
    splits     Splits, the one type every task's loading returns, the row types, and the DataLoader of a split
    tables     labelled tables (classify, regress, multilabel): in memory, or via arrow/images/stream
    targets    what label columns become for regress and multilabel
    text       text to model as token windows (lm); textcls: text to classify; hftext: for a transformers model
    packing    texts packed into full rows (--packing), and the block-diagonal mask for models that need it
    tokenizer  characters, bytes and BPE: every tokenizer a run makes
    images, arrow, stream   images decoded per batch, big tables in Arrow, streams
    bundled    the bundled sets: digits, Tiny Shakespeare (and speakers: who speaks), instructions and
               questions (generated chats and prompts with checkable answers), preferences (generated pairs)

Nothing here imports tasks/: a task's module calls the loader it needs (layering: tasks -> data -> config).
"""
