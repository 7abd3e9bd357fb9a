"""What every launcher shares: the typed job (`config`), its command line (`flag_binding`), the
one entry path (`cli`), the config turned into library objects (`build`), the job's folder and
runs (`job`), summaries (`report`) and the multi-host join (`distributed`)."""
