mod audit;
mod docker;
mod fuzz;
mod gateway;
mod run;
mod script;
mod ssh;
mod support;
