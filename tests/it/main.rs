mod audit;
mod fuzz;
mod run;
mod script;
mod ssh;
mod support;
