"""The readers of each source: a dataset's files (or its generator) read into an ``ArrayDataset`` (``arrays``), the
form every source becomes before it is made a federation (``fedsl.data``).

- images: ``cifar10``, ``stl10`` (D0's or FedDF's unlabelled data only), ``mnist`` and ``emnist`` (the publishers'
  ``idx`` files), ``image_folder`` (a folder per class, your own), ``synthetic`` (the paper's font characters,
  FSLsyn) and ``toy`` (generated stripes: the example of a new dataset);
- text: ``shakespeare`` (the plays, split by role) and ``leaf`` (LEAF's JSON files of its benchmarks);
- files: ``hf_files`` (Hugging Face datasets' parquet/arrow files, offline) and ``array_files`` (your own arrays);
- ``download``: fetching a dataset's files for real users, checked against their checksums.

Errors are ``fedsl.core.errors.DataError`` (one line naming the file and the fix). A source knows nothing of clients:
it may import ``core`` only. Every source is named in ``fedsl.data.registry``, which imports it on first use.
"""
