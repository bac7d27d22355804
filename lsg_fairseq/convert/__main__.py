from lsg_fairseq.cli.convert import main

main()
