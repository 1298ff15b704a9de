"""The data side of GPT pretraining, interchangeable with Megatron-LM's files.

readers        JSON lines / parquet / text corpora, one document at a time, errors as file:line
tokenizer      GPT-2 BPE from vocab.json + merges.txt, byte-level BPE trained on a corpus
prepare        corpus -> tokenizer -> .bin/.idx (what ``gptforge prepare`` runs)
default_corpus the embedded corpus: the Python standard library's documentation
indexed        MMIDIDX v1 reader (memory-mapped), writer, validation, merging
summary        what ``gptforge data inspect`` reports
sample_index   GPT sample index and blending indices (NumPy reference; compiled helpers.cpp)
gpt_dataset    GPTDataset / BlendedDataset with Megatron's document, sample and shuffle indices
"""
