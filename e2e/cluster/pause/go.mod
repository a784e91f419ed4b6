module starsd.local/pause

go 1.22
